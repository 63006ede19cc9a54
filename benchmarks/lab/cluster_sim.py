"""How fast is the cluster simulator, and how do the routers compare in it? Simulator wall
time on the Azure chat trace (``speed``), and the routers on the shared-prefix scenario
(``routers``). Figures are the virtual clock's (deterministic); wall times are this
machine's, printed with the load average.

    python3 benchmarks/lab/cluster_sim.py routers
    python3 benchmarks/lab/cluster_sim.py speed --trace ../shared/traces/azure-llm-2023-conv.csv
    python3 benchmarks/lab/cluster_sim.py speed --count 5000 --router prefix"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import time

from aioserve.reports.cluster import cluster_figures, format_cluster
from aioserve.sim.cluster import simulate_cluster
from aioserve.sim.simulator import SimConfig
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import load_workload

ROUTERS = "round_robin,least_outstanding,pow2,prefix"


def azure(path: str, count: int | None, speedup: float) -> list[WorkloadRequest]:
    """The processed Azure trace (arrived_at, num_prefill_tokens, num_decode_tokens), time
    divided by ``speedup``, lengths as they are."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))[:count]
    return [WorkloadRequest(f"az{i:05d}", float(r["arrived_at"]) / speedup,
                            max(int(r["num_prefill_tokens"]), 1),
                            max(int(r["num_decode_tokens"]), 1)) for i, r in enumerate(rows)]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def routers(args: argparse.Namespace) -> None:
    workload = load_workload(args.workload)
    config = SimConfig(slots=args.slots, kv_blocks=args.kv_blocks, step_ms=args.step_ms,
                       prefill_ms_per_token=args.prefill_ms_per_token,
                       enable_prefix_caching=True)
    runs = []
    for name in args.router.split(","):
        start = time.perf_counter()
        result = asyncio.run(simulate_cluster(workload, args.replicas, name, "fcfs", config))
        runs.append(cluster_figures(result, args.slo_ttft_ms))
        print(f"{name}: {time.perf_counter() - start:.2f} s wall | load average {load()}")
    print(format_cluster(runs, f"{args.workload} on {args.replicas} replicas, "
                               f"{args.slots} slots, {args.kv_blocks} KV blocks each, "
                               f"TTFT objective {args.slo_ttft_ms} ms"))


def speed(args: argparse.Namespace) -> None:
    workload = azure(args.trace, args.count, args.speedup)
    config = SimConfig(slots=args.slots)  # the article's timing: 50 ms a step
    for name in args.router.split(","):
        print(f"load average before: {load()}")
        start = time.perf_counter()
        result = asyncio.run(simulate_cluster(workload, args.replicas, name, "fcfs", config))
        wall = time.perf_counter() - start
        steps = sum(len(r.steps) for r in result.replicas)
        finished = sum(len(r.finished) for r in result.replicas)
        print(f"{name}: {len(workload)} requests ({finished} finished) over {args.replicas} "
              f"replicas x {args.slots} slots, time / {args.speedup:g}: {steps} steps in "
              f"{wall:.1f} s = {len(workload) / wall:.0f} requests/s, {steps / wall:.0f} "
              f"steps/s | load average after: {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("routers")
    one.add_argument("--workload", default="shared-prefix:n=400,rate=12,prompts=16,hot=0.3")
    one.add_argument("--replicas", type=int, default=4)
    one.add_argument("--router", default=ROUTERS)
    one.add_argument("--slots", type=int, default=8)
    one.add_argument("--kv-blocks", type=int, default=128)
    one.add_argument("--step-ms", type=float, default=20.0)
    one.add_argument("--prefill-ms-per-token", type=float, default=0.2)
    one.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    two = sub.add_parser("speed")
    two.add_argument("--trace", default="../shared/traces/azure-llm-2023-conv.csv")
    two.add_argument("--count", type=int, default=None)
    two.add_argument("--speedup", type=float, default=4.0)
    two.add_argument("--replicas", type=int, default=4)
    two.add_argument("--slots", type=int, default=32)
    two.add_argument("--router", default="round_robin")
    args = parser.parse_args()
    routers(args) if args.what == "routers" else speed(args)


if __name__ == "__main__":
    main()
