"""spf's floor (issue 31): with the learned predictor and no hints, on ``routes`` (output
lengths depend on the route in metadata) at 1.2x capacity, 8 slots, medians over 3 seeds:
mean TTFT <= 0.6x fcfs, within 1.3x of spf with the oracle, Kendall's tau of the predicted
order >= 0.5 over the requests after the first 100.

Capacity: the requests/s fcfs finishes with its queue never empty (every request of the
scenario queued at t=0), in the same simulated engine. Timing: a calibrated profile
(``--profile FILE``, or ``--model M`` to calibrate one here, about 30 s), else flat 20 ms
steps with prefill free (said on the output). Quote it with the load average it prints.

python3 benchmarks/spf_floor.py --model ../shared/models/stories260K-hf"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from dataclasses import replace
from typing import Any

from aioserve.reports.figures import policy_figures
from aioserve.sim.simulator import SimConfig, simulate, timing_line
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.scenarios import routes

POLICIES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "fcfs": ("fcfs", None), "learned": ("spf", None),
    "oracle": ("spf", {"predictor": "oracle"}),
}


async def profile_of(args: argparse.Namespace) -> StepCostModel | None:
    """The step cost: the ``--profile`` file, one calibrated on ``--model``, or None (flat)."""
    if args.profile:
        return StepCostModel.load(args.profile)
    if not args.model:
        return None
    from aioserve import AsyncEngine, EngineConfig
    from aioserve.sim.calibrate import calibrate

    async with AsyncEngine(EngineConfig(model=args.model, max_num_seqs=args.slots)) as engine:
        return await calibrate(engine, rounds=2)


async def capacity(config: SimConfig, n: int) -> float:
    """Requests/s fcfs finishes with every request queued at t=0."""
    saturated = [replace(item, arrival_s=0.0) for item in routes(n=n, rate=1.0, seed=99)]
    figures = policy_figures(await simulate(saturated, "fcfs", config))
    return float(figures["throughput_req_s"])


async def main(args: argparse.Namespace) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}")
    model = await profile_of(args)
    config = SimConfig(slots=args.slots, step_ms=20.0, kv_blocks=args.kv_blocks,
                       cost_model=model, overlap=model is not None,
                       max_model_len=args.max_model_len)
    cap = await capacity(config, args.requests)
    rate = args.load * cap
    print(f"capacity {cap:.2f} requests/s (fcfs, queue never empty); running at {rate:.2f} "
          f"({args.load}x), {args.requests} requests, seeds {args.seeds}")
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name in POLICIES}
    for seed in args.seeds:
        workload = routes(n=args.requests, rate=rate, seed=seed)
        for name, (policy, params) in POLICIES.items():
            result = await simulate(workload, policy, config, scheduler_params=params)
            figures[name].append(policy_figures(result))
    print(timing_line(result))

    def median(name: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[name])

    for name in POLICIES:
        print(f"{name:>8}: mean TTFT {median(name, 'mean_ttft_s'):.3f} s, p99 TTFT "
              f"{median(name, 'p99_ttft_s'):.3f} s, mean E2E {median(name, 'mean_e2e_s'):.3f} s")
    ttft = {name: median(name, "mean_ttft_s") for name in POLICIES}
    tau = median("learned", "prediction_tau_after")
    print(f"spf floor | mean TTFT learned/fcfs {ttft['learned'] / ttft['fcfs']:.2f} "
          f"[floor <= 0.6]; learned/oracle {ttft['learned'] / ttft['oracle']:.2f} "
          f"[floor <= 1.3]; Kendall's tau after the first 100 {tau:.2f} [floor >= 0.5]; "
          f"MAE {median('learned', 'prediction_mae'):.1f} tokens")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="calibrate a profile on this model")
    parser.add_argument("--profile", default=None, help="a calibrated profile (simulate "
                        "--calibrate); neither: flat 20 ms steps")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=1024,
                        help="KV blocks (default 1024: a full 2048-token context per slot)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--load", type=float, default=1.2, help="times capacity")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    asyncio.run(main(parser.parse_args()))
