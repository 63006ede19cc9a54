"""Real traces and capacity on this machine (issue 32, items 1 and 2): a Mooncake window's
prefix-cache hit rate in the simulator and on a live server; an Azure window's capacity per
policy in the simulator; and the same sweep at a few rates against a live server beside the
simulated curve. Prints the load average before and after.

python3 benchmarks/trace_capacity.py --model ../shared/models/stories260K-hf \\
    --profile profile.json     # from: aioserve simulate --calibrate --slots 8 ..."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from aioserve.bench.online.serving import run_serving
from aioserve.bench.online.sweep import live_sweep
from aioserve.bench.server_process import ServerProcess
from aioserve.reports.serving import summarize
from aioserve.reports.sweep import format_sweep, plot_sweep, simulate_sweep
from aioserve.sim.capacity import parse_rates
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.body import workload_requests
from aioserve.workloads.scenarios import load_workload

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def prefix_hits(url: str, spec: str, config: SimConfig) -> tuple[float, float]:
    """Prefix-cache hit rate by prompt tokens: simulated, then on the server."""
    workload = load_workload(spec)
    result = await simulate(workload, "fcfs", config)
    simulated = sum(r.num_cached_tokens for r in result.finished.values()) / sum(
        w.prompt_len for w in workload)
    records, duration, used = await run_serving(url, workload_requests(spec, 512),
                                                endpoint="completions")
    return simulated, summarize(records, duration, used).metrics["prefix_hit_rate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--profile", required=True, help="from aioserve simulate --calibrate")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=256)
    parser.add_argument("--mooncake", default=f"{TRACES / 'mooncake-2025-conversation.jsonl'}:"
                        "start=1800,n=300,len_scale=1/32,max_len=512,rate=8")
    parser.add_argument("--azure", default=f"{TRACES / 'azure-llm-2023-conv.csv'}:"
                        "start=600,n=200,len_scale=auto,max_len=512")
    parser.add_argument("--sim-rates", default="20:60:9")
    parser.add_argument("--live-rates", default="10:30:3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--live-repeats", type=int, default=1)
    parser.add_argument("--slo-ttft-ms", type=float, default=100.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=20.0)
    parser.add_argument("--plot", default="trace_capacity.png")
    args = parser.parse_args()
    print(f"load average before: {load()}")
    profile = StepCostModel.load(args.profile)
    config = SimConfig(slots=args.slots, kv_blocks=args.kv_blocks, enable_prefix_caching=True,
                       cost_model=profile, overlap=True, max_model_len=512)
    target = 0.9
    curves = asyncio.run(simulate_sweep(
        args.azure, ["fcfs", "spf"], parse_rates(args.sim_rates), args.repeats,
        lambda _w: config, args.slo_ttft_ms, args.slo_tpot_ms))
    print(format_sweep(curves, target, f"simulated Azure window {args.azure}; SLO TTFT "
                       f"{args.slo_ttft_ms} ms, TPOT {args.slo_tpot_ms} ms"))
    server = ServerProcess(["--model", args.model, "--max-num-seqs", str(args.slots),
                            "--num-kv-blocks", str(args.kv_blocks), "--max-model-len", "512",
                            "--log-level", "warning"])
    try:
        server.wait_ready()
        simulated, live = asyncio.run(prefix_hits(server.url, args.mooncake, config))
        print(f"\nMooncake window {args.mooncake}\nprefix-cache hit rate by prompt tokens: "
              f"simulated {simulated:.1%}, live server {live:.1%}")
        rates = parse_rates(args.live_rates)
        live_curve = asyncio.run(live_sweep(
            server.url, args.azure, rates, args.live_repeats, vocab_size=512,
            slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms, label="live fcfs",
            endpoint="completions"))
    finally:
        server.stop()
    same = asyncio.run(simulate_sweep(args.azure, ["fcfs"], rates, args.live_repeats,
                                      lambda _w: config, args.slo_ttft_ms, args.slo_tpot_ms))
    same[0].policy = "simulated fcfs"
    print()
    print(format_sweep([*same, live_curve], target, "the same rates, simulated and live"))
    plot_sweep([*curves, *same, live_curve], target, args.plot,
               "Azure window: simulated per policy, and live at a few rates")
    print(f"plot: {args.plot}\nload average after: {load()}")
    print(json.dumps({"simulated": [c.to_dict(target) for c in curves],
                      "live": live_curve.to_dict(target)}))


if __name__ == "__main__":
    main()
