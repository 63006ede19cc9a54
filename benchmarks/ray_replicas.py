"""Ray Serve scale-out: output tokens/s in process, then on 1 and 2 Ray Serve replicas.

Ray workers start at nice 15, starving on a shared machine; this sets ``RAY_worker_niceness`` to
0 (unless set) so the columns compete on equal terms.

    python benchmarks/ray_replicas.py --model /work/shared/models/stories260K-hf
    python benchmarks/ray_replicas.py --model M --replicas 1 2 4 --replica-num-cpus 1
    python benchmarks/ray_replicas.py --model M --replicas 2 --prefix-groups 8 --router prefix"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import time
from typing import Any

import aiohttp
from aiohttp import web

from aioserve.bench.server_process import free_port
from aioserve.config import EngineConfig
from aioserve.server import ServerConfig, create_app

MODEL_NAME = "bench"


async def one(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int
              ) -> tuple[int, str]:
    """One streamed call: (completion tokens, replica that served it)."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        replica = resp.headers.get("x-aioserve-replica", "in-process")
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line[6:]).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
    return tokens, replica


#: A shared prefix of several token blocks.
STORY = "Once upon a time there was a little girl who loved to play in the park. " * 4


def prompts_of(num_requests: int, groups: int) -> list[str]:
    """Distinct prompts, or ``groups`` groups sharing their first 300 characters."""
    if groups <= 0:
        return [f"Once upon a time there was a child number {i}" for i in range(num_requests)]
    return [f"Story {i % groups}. {STORY} Child number {i}." for i in range(num_requests)]


async def load(url: str, num_requests: int, max_tokens: int, groups: int = 0
               ) -> dict[str, Any]:
    """Send the workload: tokens/s, requests per replica, replicas per prefix group."""
    prompts = prompts_of(num_requests, groups)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(session, url, p, 4) for p in prompts[:2]))
        start = time.perf_counter()
        results = await asyncio.gather(*(one(session, url, p, max_tokens) for p in prompts))
        elapsed = time.perf_counter() - start
    tokens = sum(count for count, _ in results)
    spread = collections.Counter(replica for _, replica in results)
    served_by: dict[int, set[str]] = collections.defaultdict(set)
    for i, (_, replica) in enumerate(results):
        served_by[i % max(groups, 1)].add(replica)
    return {"seconds": elapsed, "output_tokens": tokens, "tokens_per_s": tokens / elapsed,
            "requests_per_replica": sorted(spread.values(), reverse=True),
            "replicas_per_prefix": (sum(map(len, served_by.values())) / len(served_by)
                                    if groups > 0 else "-")}


async def in_process(engine: EngineConfig, server: ServerConfig, args: argparse.Namespace
                     ) -> dict[str, Any]:
    """The workload through ``aioserve serve``'s app in this process."""
    runner = web.AppRunner(create_app(engine, server), handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        return await load(f"http://127.0.0.1:{port}", args.requests, args.max_tokens,
                          args.prefix_groups)
    finally:
        await runner.cleanup()


def on_ray(engine: EngineConfig, server: ServerConfig, args: argparse.Namespace,
           replicas: int, port: int) -> dict[str, Any]:
    """The workload through ``replicas`` engine replicas on Ray Serve."""
    from aioserve.deploy.ray_serve import RayServeOptions, start

    options = RayServeOptions(num_replicas=replicas, router=args.router,
                              stream_interval=args.stream_interval,
                              ray_actor_options={"num_cpus": args.replica_num_cpus})
    url = start(engine, server, options, port=port, num_cpus=args.ray_num_cpus)
    return asyncio.run(load(url, args.requests, args.max_tokens, args.prefix_groups))


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--replica-num-cpus", type=float, default=0.5)
    parser.add_argument("--ray-num-cpus", type=int, default=2)
    parser.add_argument("--router", default="pow2",
                        help="an aioserve router: round_robin, least_outstanding, pow2, prefix")
    parser.add_argument("--stream-interval", type=float, default=0.02)
    parser.add_argument("--prefix-groups", type=int, default=0,
                        help="prompts in this many groups sharing a 300-character prefix "
                             "(0: all distinct)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_worker_niceness", "0")
    engine = EngineConfig(model=args.model, device=args.device, max_num_seqs=args.max_num_seqs)
    server = ServerConfig(served_model_name=MODEL_NAME)
    results = {"in-process": asyncio.run(in_process(engine, server, args))}
    port = free_port()
    for replicas in args.replicas:
        results[f"ray x{replicas}"] = on_ray(engine, server, args, replicas, port)
    print(f"{args.requests} streamed requests x {args.max_tokens} tokens, "
          f"max_num_seqs={args.max_num_seqs}, router={args.router}, "
          f"stream_interval={args.stream_interval}s, prefix groups={args.prefix_groups}")
    print(f"{'':>24}" + "".join(f"{name:>16}" for name in results))
    for row in ("tokens_per_s", "seconds", "requests_per_replica", "replicas_per_prefix"):
        cells = "".join(f"{_cell(r[row]):>16}" for r in results.values())
        print(f"{row:>24}{cells}")
    return results


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return "/".join(map(str, value)) if isinstance(value, list) else str(value)


if __name__ == "__main__":
    main()
