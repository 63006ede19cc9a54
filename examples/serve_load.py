"""Load a running ``aioserve serve`` with many concurrent SSE streams and report
requests/s, output tokens/s, TTFT percentiles and errors.

    aioserve serve --model ../shared/models/stories260K-hf --max-num-seqs 256 \\
        --num-kv-blocks 4096 --port 8000 &
    python examples/serve_load.py --url http://127.0.0.1:8000 --concurrency 256 --requests 1024

Each of ``--concurrency`` workers sends streamed ``/v1/completions`` requests back to
back until ``--requests`` have been sent. TTFT is measured at the client: request sent
to first chunk with text. Loopback only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def one_request(
    session: aiohttp.ClientSession, url: str, body: dict, ttfts: list[float]
) -> int:
    """Stream one completion; returns its completion tokens (raises on any error)."""
    start = time.perf_counter()
    first = None
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if first is None and any(c.get("text") for c in chunk["choices"]):
                first = time.perf_counter() - start
    if first is not None:
        ttfts.append(first)
    return tokens


async def run(args: argparse.Namespace) -> dict[str, float]:
    """Run the load; returns the figures."""
    body = {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if args.model:
        body["model"] = args.model
    ttfts: list[float] = []
    errors: list[str] = []
    tokens = 0
    sent = 0
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=args.timeout)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal tokens, sent
        while sent < args.requests:
            sent += 1
            try:
                generated = await one_request(session, args.url, body, ttfts)
                tokens += generated
            except Exception as exc:  # counted and reported, the load goes on
                errors.append(f"{type(exc).__name__}: {exc}")

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - start
    done = args.requests - len(errors)
    return {
        "requests": args.requests, "concurrency": args.concurrency, "errors": len(errors),
        "elapsed_s": elapsed, "requests_per_s": done / elapsed,
        "output_tokens_per_s": tokens / elapsed,
        "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p99_s": percentile(ttfts, 0.99),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
        "first_error": errors[0] if errors else "",
    }


def main() -> None:
    """Parse options, run, print one JSON line of figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="model name to send (default: none)")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    args = parser.parse_args()
    if not (args.url.startswith("http://127.") or args.url.startswith("http://localhost")):
        parser.error("--url must be a loopback address")
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
