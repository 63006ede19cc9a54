"""SIGTERM under load: how each of N streams ended and how long the server took to exit.

    python benchmarks/shutdown_under_load.py --model ../shared/models/stories260K-hf \\
        --streams 64 --max-num-seqs 32 --shutdown-timeout 10"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

import aiohttp


async def stream(session: aiohttp.ClientSession, url: str, max_tokens: int) -> str:
    """How one stream ended: ``done``, ``error`` (an error event) or ``cut``."""
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True}
    last = ""
    try:
        async with session.post(url + "/v1/completions", json=body) as response:
            async for raw in response.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    last = line[6:]
    except aiohttp.ClientError:
        return "cut"
    if last == "[DONE]":
        return "done"
    return "error" if last and "error" in json.loads(last) else "cut"


async def main(args: argparse.Namespace) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioserve.cli", "serve", "--model", args.model, "--port", "0",
        "--max-num-seqs", str(args.max_num_seqs), "--shutdown-timeout",
        str(args.shutdown_timeout), stdout=asyncio.subprocess.PIPE,
        stderr=None if args.verbose else asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    url = (await proc.stdout.readline()).decode().split()[-1]
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(stream(session, url, args.max_tokens))
                 for _ in range(args.streams)]
        while True:  # every slot busy
            async with session.get(url + "/metrics") as r:
                text = await r.text()
            running = next(float(line.split()[-1]) for line in text.splitlines()
                           if line.startswith("aioserve:num_requests_running"))
            if running >= args.max_num_seqs:
                break
            await asyncio.sleep(0.05)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        outcomes = await asyncio.gather(*tasks)
        code = await proc.wait()
        exit_s = time.monotonic() - signalled
    counts = {kind: outcomes.count(kind) for kind in ("done", "error", "cut")}
    print(f"streams {args.streams}, slots {args.max_num_seqs}, max_tokens {args.max_tokens}, "
          f"--shutdown-timeout {args.shutdown_timeout} s")
    print(f"finished with [DONE] {counts['done']}, ended with an error event "
          f"{counts['error']}, cut {counts['cut']}; ended cleanly "
          f"{counts['done'] + counts['error']}/{args.streams}")
    print(f"exit status {code}, exit {exit_s:.2f} s after SIGTERM")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--shutdown-timeout", type=float, default=10.0)
    parser.add_argument("--verbose", action="store_true", help="show the server log")
    asyncio.run(main(parser.parse_args()))
