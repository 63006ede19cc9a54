"""Issue 32's rate-sweep floor: the simulated highest rate at a target SLO attainment against
the one found by sweeping a live server (``aioserve serve`` in its own process) at a few rates
on the same trace window.

python3 benchmarks/sweep_vs_live.py --model ../shared/models/stories260K-hf

The simulator's profile comes from separate runs on a held-out window of the trace (the
spec's window after the sweep's repeats, every request at t=0): calibrated on the engine in
this process, then scaled by one factor so that the simulated burst is as fast as the same
burst through the live server (:func:`aioserve.sim.calibrate.match_throughput`: the served
path's HTTP and streams, which an in-process calibration does not see). The live rates are
fractions of that burst's throughput; the simulated curve runs at the same rates and on a
finer grid. Prints the load average before and after."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from aioserve import AsyncEngine, EngineConfig
from aioserve.bench.online.metrics import summarize
from aioserve.bench.online.serving import run_serving
from aioserve.bench.online.sweep import live_sweep
from aioserve.bench.online.workload_file import workload_requests
from aioserve.bench.server_process import ServerProcess
from aioserve.sim.calibrate import calibrate, match_throughput
from aioserve.sim.real import sim_config_of
from aioserve.sim.reports.figures import policy_figures
from aioserve.sim.reports.sweep import format_sweep, simulate_sweep
from aioserve.sim.scenarios import load_workload
from aioserve.sim.simulator import SimConfig, simulate

TRACE = "../shared/traces/azure-llm-2023-conv.csv:start=600,n=200,len_scale=auto,max_len=512"


async def profile_of(args: argparse.Namespace, held_out: str) -> tuple[SimConfig, int]:
    """The engine's profile fitted on ``held_out`` in this process, and its vocabulary."""
    config = EngineConfig(model=args.model, max_num_seqs=args.slots,
                          num_kv_blocks=args.kv_blocks, max_model_len=512)
    async with AsyncEngine(config) as engine:
        profile = await calibrate(engine, load_workload(held_out), rounds=2)
        return sim_config_of(engine, cost_model=profile), engine.runner.vocab_size


async def simulated_burst(spec: str, config: SimConfig) -> float:
    """Requests per second of the simulated engine on ``spec`` (every request at t=0)."""
    figures = policy_figures(await simulate(load_workload(spec), "fcfs", config))
    return figures["finished"] / figures["makespan_s"]


async def live_burst(url: str, spec: str, vocab: int) -> float:
    records, duration, used = await run_serving(url, workload_requests(spec, vocab),
                                                endpoint="completions")
    result = summarize(records, duration, used)
    if result.failed:
        raise RuntimeError(f"{result.failed} requests of the burst failed")
    return float(result.metrics["request_throughput"])


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="../shared/models/stories260K-hf")
    parser.add_argument("--trace", default=TRACE, help="a trace window (README: Real traces)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=256)
    parser.add_argument("--fractions", default="0.4,0.6,0.8,1.0,1.2",
                        help="live rates, as fractions of the live burst's throughput")
    parser.add_argument("--repeats", type=int, default=3, help="windows per rate")
    parser.add_argument("--slo-ttft-ms", type=float, default=100.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=20.0)
    parser.add_argument("--target", type=float, default=0.9)
    args = parser.parse_args()
    try:
        fractions = sorted(float(f) for f in args.fractions.split(","))
    except ValueError:
        parser.error(f"--fractions: comma-separated numbers, got {args.fractions!r}")
    try:
        load_workload(args.trace)  # a bad spec is refused before anything starts
    except ValueError as exc:
        parser.error(f"--trace: {exc}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    held_out = f"{args.trace},window={args.repeats},speed=1e9"
    config, vocab = asyncio.run(profile_of(args, held_out))
    server = ServerProcess(["--model", args.model, "--max-num-seqs", str(args.slots),
                            "--num-kv-blocks", str(args.kv_blocks), "--max-model-len", "512",
                            "--log-level", "warning"])
    try:
        server.wait_ready()
        burst = asyncio.run(live_burst(server.url, held_out, vocab))
        scaled, factor = asyncio.run(match_throughput(
            config, burst, lambda c: simulated_burst(held_out, c)))
        rates = [round(f * burst, 3) for f in fractions]
        print(f"held-out window {held_out}: live burst {burst:.2f} req/s; simulated step cost "
              f"= the in-process profile x {factor:.2f}; live rates {rates}")
        live = asyncio.run(live_sweep(
            server.url, args.trace, rates, args.repeats, vocab_size=vocab,
            slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms, label="live fcfs",
            endpoint="completions"))
    finally:
        server.stop()
    fine = [rates[0] + i * (rates[-1] - rates[0]) / 16 for i in range(17)]
    curves = {}
    for label, grid, profile in (("simulated", rates, scaled), ("simulated, fine", fine, scaled),
                                 ("profile alone", fine, config)):
        curve, = asyncio.run(simulate_sweep(args.trace, ["fcfs"], grid, args.repeats,
                                            lambda _w, p=profile: p, args.slo_ttft_ms,
                                            args.slo_tpot_ms))
        curve.policy = label
        curves[label] = curve
    print(format_sweep([curves["simulated"], live], args.target,
                       f"{args.trace}; SLO TTFT {args.slo_ttft_ms} ms, TPOT "
                       f"{args.slo_tpot_ms} ms; the live rates"))
    real = live.capacity(args.target)
    print(f"capacity at {args.target:.0%} attainment: live {real}")
    for label, curve in curves.items():
        cap = curve.capacity(args.target)
        error = ("a bound, no error: widen --fractions" if real.bound or cap.bound
                 else f"{100 * (cap.rate - real.rate) / real.rate:+.1f}%")
        print(f"  {label:<16} {cap} ({error})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return {label: curve.to_dict(args.target) for label, curve in
            {**curves, "live": live}.items()}


if __name__ == "__main__":
    main()
