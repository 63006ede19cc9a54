"""Issue 32's rate-sweep floor: the simulated highest rate at a target SLO attainment against
the one found by sweeping a live server (``aioserve serve`` in its own process) at a few rates
on the same trace window.

python3 benchmarks/sweep_vs_live.py --model ../shared/models/stories260K-hf

The simulator's profile is fitted on the live server's own steps (``aioserve serve
--step-log``) while it serves a held-out window of the trace (the spec's window after the
sweep's repeats): once all at t=0, then once at each of the sweep's rates. A served step
carries what serving adds on the same cores (HTTP, streams, the load generator), which an
in-process calibration does not see. The live rates are fractions of that burst's
throughput; the simulated curve runs at the same rates and on a finer grid. For comparison,
two older ways: the in-process profile scaled so that the simulated burst is as fast as the
served one (:func:`aioserve.sim.calibrate.match_throughput`), and the in-process profile
alone. The sweep's own steps then give each rate's drift (measured over predicted busy time)
and a "paired" curve on the served profile times the sweep's median drift: a diagnosis that
reads the live run, not a prediction. Prints the load average before and after."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from aioserve import AsyncEngine, EngineConfig
from aioserve.bench.online.serving import run_serving
from aioserve.bench.online.sweep import live_sweep
from aioserve.bench.server_process import ServerProcess
from aioserve.reports.figures import policy_figures
from aioserve.reports.serving import summarize
from aioserve.reports.sweep import format_sweep, simulate_sweep
from aioserve.sim.calibrate import calibrate, match_throughput
from aioserve.sim.capacity import Curve
from aioserve.sim.fit_report import format_fit, held_out_drift
from aioserve.sim.real import sim_config_of
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.sim.step_cost import fit_profile
from aioserve.sim.step_log import read_step_log
from aioserve.workloads.body import workload_requests
from aioserve.workloads.scenarios import load_workload

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
    return float(policy_figures(await simulate(load_workload(spec), "fcfs", config))[
        "throughput_req_s"])


async def live_run(url: str, spec: str, vocab: int) -> float:
    """Requests per second of the live server on ``spec``."""
    records, duration, used = await run_serving(url, workload_requests(spec, vocab),
                                                endpoint="completions")
    result = summarize(records, duration, used)
    if result.failed:
        raise RuntimeError(f"{result.failed} requests of {spec} failed")
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
    held_out = f"{args.trace},window={args.repeats}"
    config, vocab = asyncio.run(profile_of(args, f"{held_out},speed=1e9"))
    step_log = Path(tempfile.mkdtemp()) / "steps.jsonl"
    server = ServerProcess(["--model", args.model, "--max-num-seqs", str(args.slots),
                            "--num-kv-blocks", str(args.kv_blocks), "--max-model-len", "512",
                            "--log-level", "warning", "--step-log", str(step_log)])
    bounds = []  # (rate, start, end) of each live rate on the engine's clock (monotonic)
    try:
        server.wait_ready()
        burst = asyncio.run(live_run(server.url, f"{held_out},speed=1e9", vocab))
        rates = [round(f * burst, 3) for f in fractions]
        for rate in rates:
            asyncio.run(live_run(server.url, f"{held_out},rate={rate}", vocab))
        calibrated = time.monotonic()
        live = Curve("live fcfs", rates)
        for rate in rates:
            start = time.monotonic()
            live.runs += asyncio.run(live_sweep(
                server.url, args.trace, [rate], args.repeats, vocab_size=vocab,
                slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
                endpoint="completions")).runs
            bounds.append((rate, start, time.monotonic()))
    finally:
        server.stop()
    engine, steps = read_step_log(step_log)
    served = fit_profile([s for s in steps if s.end_time < calibrated],
                         source={**engine, "step_log": str(step_log)})
    print(f"held-out window {held_out}: live burst {burst:.2f} req/s, then once at each live "
          f"rate {rates}; the profile fitted on the server's {served.fit['steps']:.0f} steps "
          f"then:\n{format_fit(served, worst=4)}")
    drifts = [held_out_drift(served, [s for s in steps if start <= s.start_time
                                      and s.end_time <= end]) for _, start, end in bounds]
    print("drift of the sweep's steps against that profile, by rate: " + ", ".join(
        f"{rate}: {d:.3f}" for (rate, _, _), d in zip(bounds, drifts)))
    sim_served = replace(config, cost_model=served)
    scaled, factor = asyncio.run(match_throughput(
        config, burst, lambda c: simulated_burst(f"{held_out},speed=1e9", c)))
    paired = replace(config, cost_model=served.scaled(statistics.median(drifts)))
    fine = [rates[0] + i * (rates[-1] - rates[0]) / 16 for i in range(17)]
    curves = {}
    for label, grid, sim_config in (
            ("served profile", rates, sim_served), ("served, fine", fine, sim_served),
            (f"in-process x{factor:.2f}", fine, scaled), ("in-process", fine, config),
            ("paired (diagnosis)", fine, paired)):
        curve, = asyncio.run(simulate_sweep(args.trace, ["fcfs"], grid, args.repeats,
                                            lambda _w, p=sim_config: p, args.slo_ttft_ms,
                                            args.slo_tpot_ms))
        curve.policy = label
        curves[label] = curve
    print(format_sweep([curves["served profile"], live], args.target,
                       f"{args.trace}; SLO TTFT {args.slo_ttft_ms} ms, TPOT "
                       f"{args.slo_tpot_ms} ms; the live rates"))
    real = live.capacity(args.target)
    print(f"capacity at {args.target:.0%} attainment: live {real}")
    for label, curve in curves.items():
        cap = curve.capacity(args.target)
        error = ("a bound, no error: widen --fractions" if real.bound or cap.bound
                 else f"{100 * (cap.rate - real.rate) / real.rate:+.1f}%")
        print(f"  {label:<20} {cap} ({error})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return {label: curve.to_dict(args.target) for label, curve in
            {**curves, "live": live}.items()}


if __name__ == "__main__":
    main()
