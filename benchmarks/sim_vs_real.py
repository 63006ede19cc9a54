"""Does the simulator predict this engine? Calibrate the step cost on one workload,
then run three others (bursty Poisson, a priority mix, a two-tenant overload) under
each policy both on the real engine (in process, the test model, ``--repeats`` times)
and in the simulator with the fitted profile, and print mean and p99 TTFT, mean E2E
latency and preemptions side by side, the errors, and whether the policies rank the
same. Quote it on a quiet machine (the load average is printed).

    python3 benchmarks/sim_vs_real.py --model ../shared/models/stories260K-hf --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from aioserve import AsyncEngine, EngineConfig
from aioserve.scheduling.registry import available_schedulers
from aioserve.sim.calibrate import calibrate
from aioserve.sim.real import replay, sim_config_of
from aioserve.sim.reports.figures import policy_figures
from aioserve.sim.scenarios import load_workload
from aioserve.sim.simulator import simulate

WORKLOADS = {
    "bursty-poisson": "poisson:n=64,rate=30,burst=4,seed=11",
    "priority-mix": "priority-mix:n=64,rate=40,high=0.1,seed=12",
    "two-tenant-overload": "two-tenants:n=64,rate=60,light=0.1,seed=13",
}
FIGURES = ("mean_ttft_s", "p99_ttft_s", "mean_e2e_s", "preemptions")


def _ranking(values: dict[str, float]) -> list[str]:
    return sorted(values, key=lambda k: values[k])


def _error(sim: float, real: float) -> float:
    return 100.0 * (sim - real) / real if real else (0.0 if sim == real else float("inf"))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    config = EngineConfig(model=args.model, max_num_seqs=args.slots, num_kv_blocks=args.kv_blocks,
                          forward=args.forward)
    policies = args.policies.split(",") if args.policies else available_schedulers()
    report: dict[str, Any] = {"load_before": os.getloadavg(), "policies": policies}
    async with AsyncEngine(config) as engine:
        start = time.perf_counter()
        model = await calibrate(engine, rounds=2)
        print(f"calibrated in {time.perf_counter() - start:.0f} s: intercept "
              f"{model.intercept_ms:.3f} ms, per row {model.per_seq_ms:.4f}, per prefill token "
              f"{model.per_prefill_token_ms:.5f}, per context token "
              f"{model.per_context_token_ms:.6f}; R^2 {model.fit['r2']:.3f}")
        report["profile"] = {"coefficients": [model.intercept_ms, model.per_seq_ms,
                                              model.per_prefill_token_ms,
                                              model.per_context_token_ms], "fit": model.fit}
        sim_config = sim_config_of(engine, cost_model=model)
        for label, spec in WORKLOADS.items():
            workload = load_workload(spec)
            rows = {}
            for policy in policies:
                real_runs = []
                for _ in range(args.repeats):
                    real_runs.append(policy_figures(await replay(engine, workload, policy)))
                sim = policy_figures(await simulate(workload, policy, sim_config))
                rows[policy] = {"sim": {k: sim[k] for k in FIGURES},
                                "real": {k: [r[k] for r in real_runs] for k in FIGURES}}
            report[label] = rows
            _print_workload(label, spec, rows)
    report["load_after"] = os.getloadavg()
    print(f"load average before {report['load_before'][0]:.2f}, after "
          f"{report['load_after'][0]:.2f}")
    return report


def _print_workload(label: str, spec: str, rows: dict[str, Any]) -> None:
    print(f"\n{label} ({spec}): real = median [min-max] of repeats; sim; error %")
    print(f"{'policy':<14}" + "".join(f"{f:>34}" for f in FIGURES))
    medians: dict[str, dict[str, float]] = {f: {} for f in FIGURES}
    sims: dict[str, dict[str, float]] = {f: {} for f in FIGURES}
    for policy, row in rows.items():
        cells = []
        for figure in FIGURES:
            real = [v for v in row["real"][figure] if v is not None]
            median = statistics.median(real) if real else float("nan")
            sim = row["sim"][figure] or 0.0
            medians[figure][policy], sims[figure][policy] = median, sim
            cells.append(f"{median:8.3f} [{min(real):.3f}-{max(real):.3f}] {sim:8.3f} "
                         f"{_error(sim, median):+6.1f}%")
        print(f"{policy:<14}" + "".join(f"{c:>34}" for c in cells))
    for figure in ("mean_ttft_s", "mean_e2e_s"):
        real, sim = _ranking(medians[figure]), _ranking(sims[figure])
        print(f"ranking by {figure}: real {real} | sim {sim} | same: {real == sim}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="../shared/models/stories260K-hf")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=48)
    parser.add_argument("--forward", default="transformers")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policies", default=None, help="comma list (default: all registered)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    arguments = parser.parse_args()
    result = asyncio.run(main(arguments))
    if arguments.json:
        with open(arguments.json, "w") as f:
            json.dump(result, f, indent=1)
