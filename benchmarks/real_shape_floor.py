"""The real-shape floor of issue 32: a SmolLM2-135M-shaped random model on an Azure window with
lengths clipped to 1,024 tokens, at a fraction of capacity: mean TTFT, p99 TTFT and mean E2E of
the real engine (median of repeats) against the simulator with a profile from a separate
calibration run. Prints the load average before and after.

Capacity is the real engine's saturation throughput on the window: every request arrives at
t=0 (fcfs), capacity = requests / makespan (the drain tail counted, so it errs low); the
window is then replayed at ``--load`` x capacity (its arrivals scaled to that mean rate).

aioserve simulate --calibrate --random-model smollm2-135m --slots 8 --kv-blocks 1024 \\
    --max-model-len 2048 --profile-out smollm2.json
python3 benchmarks/real_shape_floor.py --profile smollm2.json --repeats 3"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from aioserve.bench.models.random_model import ensure_random_model
from aioserve.commands.simulate import real_engine
from aioserve.config import EngineConfig
from aioserve.reports.figures import policy_figures
from aioserve.sim.fit_report import format_residuals, held_out_drift, held_out_residuals
from aioserve.sim.real import replay, sim_config_of
from aioserve.sim.simulator import simulate
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.scenarios import load_workload

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023-conv.csv"
FIGURES = ("mean_ttft_s", "p99_ttft_s", "mean_e2e_s")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def main(args: argparse.Namespace) -> None:
    print(f"load average before: {load()}")
    profile = StepCostModel.load(args.profile)
    source = profile.source
    config = EngineConfig(
        model=str(ensure_random_model(args.random_model)), max_num_seqs=source["slots"],
        num_kv_blocks=source["kv_blocks"], max_model_len=source["max_model_len"],
        block_size=source["block_size"], device=args.device,
        max_num_batched_tokens=source["max_num_batched_tokens"],
        enable_prefix_caching=source["enable_prefix_caching"])
    window = f"{args.trace}:start={args.start},n={args.n},max_len={args.max_len}"
    async with real_engine(config, tokenizer=False) as engine:
        sim = sim_config_of(engine, cost_model=profile)
        base = load_workload(window)
        await replay(engine, base[:4], "fcfs")  # warm-up
        burst = [replace(w, arrival_s=0.0) for w in base]
        simulated_capacity = len(base) / policy_figures(
            await simulate(burst, "fcfs", sim))["makespan_s"]
        capacity = args.capacity
        if capacity is None:
            started = time.perf_counter()
            capacity = len(base) / policy_figures(
                await replay(engine, burst, "fcfs"))["makespan_s"]
            print(f"capacity (real, all {len(base)} at t=0): {capacity:.3f} req/s in "
                  f"{time.perf_counter() - started:.0f} s; simulated: "
                  f"{simulated_capacity:.3f} req/s")
        rate = args.load * capacity
        workload = load_workload(f"{window},rate={rate:.4f}")
        print(f"window {window}, rate {rate:.3f} req/s ({args.load} x {capacity:.3f}), "
              f"{source['slots']} slots, profile {args.profile}")
        real: dict[str, list[float]] = {f: [] for f in FIGURES}
        steps = []
        for i in range(args.repeats):
            started = time.perf_counter()
            result = await replay(engine, workload, "fcfs")
            steps += result.feedback
            figures = policy_figures(result)
            for f in FIGURES:
                real[f].append(figures[f])
            print(f"  real run {i + 1}: " + ", ".join(f"{f} {figures[f]:.3f}" for f in FIGURES)
                  + f"; drift {held_out_drift(profile, result.feedback):.3f} "
                  f"({time.perf_counter() - started:.0f} s, load {load()})")
        simulated: dict[str, Any] = policy_figures(await simulate(workload, "fcfs", sim))
    print(f"{'figure':<12} {'real median':>12} {'simulated':>10} {'error':>8}")
    for f in FIGURES:
        median = statistics.median(real[f])
        print(f"{f:<12} {median:>12.3f} {simulated[f]:>10.3f} "
              f"{100 * (simulated[f] - median) / median:>+7.1f}%")
    rows = held_out_residuals(profile, steps)
    print(f"the profile on the real runs' {len(steps)} steps, by shape (worst 8 of {len(rows)}): "
          "steps, measured ms, predicted ms (means), error, worst step's error")
    print("\n".join(format_residuals(rows, 8)))
    print(f"load average after: {load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="from simulate --calibrate")
    parser.add_argument("--random-model", default="smollm2-135m")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--start", type=float, default=0.0, help="window start (s)")
    parser.add_argument("--n", type=int, default=64, help="requests in the window")
    parser.add_argument("--max-len", type=int, default=1024, help="clip lengths to this")
    parser.add_argument("--load", type=float, default=0.9, help="fraction of capacity")
    parser.add_argument("--capacity", type=float, default=None,
                        help="req/s, skipping the saturation run")
    parser.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
