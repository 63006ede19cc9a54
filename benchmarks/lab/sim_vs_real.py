"""Does the simulator predict this engine? Calibrate on one workload, run three others per policy
on the engine and in the simulator, and print TTFT, E2E and preemptions side by side with whether
the policies rank the same.

python3 benchmarks/lab/sim_vs_real.py --model ../shared/models/stories260K-hf --repeats 5

Trace windows at multiples of the real engine's capacity (issue 32's replay floor): each
``--trace`` spec is first run on the engine with every request at t=0 under fcfs; capacity =
requests / makespan; then replayed at ``--loads`` x that rate (the spec's ``rate=``):
python3 benchmarks/lab/sim_vs_real.py --policies fcfs,spf,vtc,priority --repeats 3 --loads 0.9,1.2 \
    --trace ../shared/traces/azure-llm-2023-conv.csv:start=600,n=200,len_scale=auto,max_len=512
(``--calibrate-on next-window``: the simulator's profile fitted on the trace's next window,
all at t=0; ``next-window-at-loads``: that and the same window replayed at each load)

Each real repeat also gets its drift: its steps' measured busy time over what the profile
predicts for the same steps (the machine slower, > 1, or faster than at calibration). The
"paired" simulation runs each repeat again on the profile times its drift: a diagnosis that
reads the real run, not a prediction; what error remains there is the simulator's, the rest
the machine's."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from dataclasses import replace
from typing import Any

from aioserve import AsyncEngine, EngineConfig
from aioserve.commands.common import add_forward_option, positive_floats
from aioserve.reports.figures import policy_figures
from aioserve.scheduling.registry import available_schedulers, load_scheduler
from aioserve.sim.calibrate import calibrate
from aioserve.sim.fit_report import format_fit, held_out_drift
from aioserve.sim.real import replay, sim_config_of
from aioserve.sim.simulator import SimResult, simulate
from aioserve.workloads.scenarios import load_workload

WORKLOADS = {
    "bursty-poisson": "poisson:n=64,rate=30,burst=4,seed=11",
    "priority-mix": "priority-mix:n=64,rate=40,high=0.1,seed=12",
    "two-tenant-overload": "two-tenants:n=64,rate=60,light=0.1,seed=13",
}
FIGURES = ("mean_ttft_s", "p99_ttft_s", "mean_e2e_s", "preemptions")


def _capacity(result: SimResult) -> float:
    """Requests finished per second, from the first arrival to the last finish."""
    return float(policy_figures(result)["throughput_req_s"])


def _ranking(values: dict[str, float]) -> str:
    """The keys from the least value up, equal values joined by ``=`` (a tie orders none)."""
    ordered = sorted(values, key=lambda k: values[k])
    text = ordered[:1]
    for before, name in zip(ordered, ordered[1:]):
        text.append(("= " if math.isclose(values[before], values[name]) else "< ") + name)
    return " ".join(text)


def _error(sim: float, real: float) -> float:
    return 100.0 * (sim - real) / real if real else (0.0 if sim == real else float("inf"))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    config = EngineConfig(model=args.model, max_num_seqs=args.slots, num_kv_blocks=args.kv_blocks,
                          forward=args.forward)
    policies = args.policies.split(",") if args.policies else available_schedulers()
    report: dict[str, Any] = {"load_before": os.getloadavg(), "policies": policies}
    async with AsyncEngine(config) as engine:
        sim_config = sim_config_of(engine)
        if not (args.trace and args.calibrate_on != "default"):
            start = time.perf_counter()
            model = await calibrate(engine, rounds=args.calibration_rounds)
            print(f"profile fitted on the built-in calibration workload in "
                  f"{time.perf_counter() - start:.0f} s\n{format_fit(model)}")
            report["profile"] = {"coefficients": list(model.coefficients()), "fit": model.fit}
            sim_config = sim_config_of(engine, cost_model=model)
        workloads = WORKLOADS if not args.trace else {}
        configs = dict.fromkeys(workloads, sim_config)
        for spec in args.trace or []:
            trace_config = sim_config
            if args.calibrate_on == "next-window":  # held out: the window after this one
                held = await calibrate(engine, load_workload(f"{spec},window=1,speed=1e9"),
                                       rounds=args.calibration_rounds)
                print(f"{spec}: profile fitted on its next window (window=1, all at t=0)\n"
                      f"{format_fit(held)}")
                trace_config = sim_config_of(engine, cost_model=held)
            burst = load_workload(f"{spec},speed=1e9")
            if args.calibrate_on == "next-window-at-loads":  # warm-up before the capacity run
                await replay(engine, load_workload(f"{spec},window=1,speed=1e9"), "fcfs")
            flat = await replay(engine, burst, "fcfs")
            capacity = _capacity(flat)
            if args.calibrate_on == "next-window-at-loads":
                window = f"{spec},window=1"
                held = await calibrate(
                    engine, load_workload(f"{window},speed=1e9"), args.calibration_rounds,
                    also=[load_workload(f"{window},rate={load * capacity:.3f}")
                          for load in args.loads])
                print(f"{spec}: profile fitted on its next window (window=1) all at t=0 and "
                      f"at {', '.join(f'{load:g}x' for load in args.loads)}\n{format_fit(held)}")
                trace_config = sim_config_of(engine, cost_model=held)
            simulated = await simulate(burst, "fcfs", trace_config)
            sim_capacity = _capacity(simulated)
            print(f"{spec}: capacity {capacity:.2f} req/s (all at t=0, fcfs), simulated "
                  f"{sim_capacity:.2f} ({len(flat.steps)} steps real, {len(simulated.steps)} "
                  f"simulated)")
            for load in args.loads:
                label = f"{spec.rsplit('/', 1)[-1]} at {load:g}x"
                workloads[label] = f"{spec},rate={load * capacity:.3f}"
                configs[label] = trace_config
        for label, spec in workloads.items():
            workload = load_workload(spec)
            real_runs: dict[str, list[SimResult]] = {p: [] for p in policies}
            for _ in range(args.repeats):  # policies interleaved: drift hits each alike
                for policy in policies:
                    real_runs[policy].append(await replay(engine, workload, policy))
            rows = {}
            config = configs[label]
            for policy in policies:
                sim = policy_figures(await simulate(workload, policy, config))
                real = [policy_figures(run) for run in real_runs[policy]]
                assert config.cost_model is not None
                drifts = [held_out_drift(config.cost_model, run.feedback)
                          for run in real_runs[policy]]
                paired = [policy_figures(await simulate(workload, policy, replace(
                    config, cost_model=config.cost_model.scaled(d)))) for d in drifts]
                rows[policy] = {"sim": {k: sim[k] for k in FIGURES},
                                "real": {k: [r[k] for r in real] for k in FIGURES},
                                "drift": drifts,
                                "paired": {k: [p[k] for p in paired] for k in FIGURES}}
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
    spans: dict[str, dict[str, tuple[float, float]]] = {f: {} for f in FIGURES}
    inside = cells_total = 0
    for policy, row in rows.items():
        cells = []
        for figure in FIGURES:
            real = [v for v in row["real"][figure] if v is not None]
            median = statistics.median(real) if real else float("nan")
            sim = row["sim"][figure] or 0.0
            medians[figure][policy], sims[figure][policy] = median, sim
            spans[figure][policy] = (min(real), max(real)) if real else (0.0, 0.0)
            inside += spans[figure][policy][0] <= sim <= spans[figure][policy][1]
            cells_total += 1
            cells.append(f"{median:8.3f} [{min(real):.3f}-{max(real):.3f}] {sim:8.3f} "
                         f"{_error(sim, median):+6.1f}%")
        print(f"{policy:<14}" + "".join(f"{c:>34}" for c in cells))
    for figure in ("mean_ttft_s", "mean_e2e_s"):
        real, sim = _ranking(medians[figure]), _ranking(sims[figure])
        print(f"ranking by {figure}: real {real} | sim {sim} | same: {real == sim}")
        separated, agree, ties = _separated_pairs(spans[figure], sims[figure])
        print(f"  pairs the real repeats separate (min-max ranges apart): {separated}; "
              f"the simulator orders {agree} of them the same, ties {ties}")
    print(f"simulated values inside the real min-max range: {inside} of {cells_total}")
    print("paired: each repeat simulated on the profile times its drift (measured / predicted "
          "busy time of its steps); median of the paired runs, error % against the real median")
    print(f"{'policy':<14}{'drift':>22}" + "".join(f"{f:>24}" for f in FIGURES))
    for policy, row in rows.items():
        drift = row["drift"]
        cells = []
        for figure in FIGURES:
            paired = statistics.median(v or 0.0 for v in row["paired"][figure])
            cells.append(f"{paired:8.3f} {_error(paired, medians[figure][policy]):+6.1f}%")
        print(f"{policy:<14}{statistics.median(drift):>8.3f} [{min(drift):.3f}-"
              f"{max(drift):.3f}]" + "".join(f"{c:>24}" for c in cells))
    print("drift of each repeat, in run order (policies interleaved): " + "; ".join(
        f"{policy} " + " ".join(f"{d:.3f}" for d in row["drift"]) for policy, row in rows.items()))


def _separated_pairs(spans: dict[str, tuple[float, float]], sims: dict[str, float]
                     ) -> tuple[int, int, int]:
    """Policy pairs the real repeats separate, how many of them the simulator orders the
    same, and how many it ties (orders neither way)."""
    separated = agree = ties = 0
    names = sorted(spans)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if spans[a][1] < spans[b][0] or spans[b][1] < spans[a][0]:
                separated += 1
                if math.isclose(sims[a], sims[b]):
                    ties += 1
                else:
                    agree += (spans[a][0] < spans[b][0]) == (sims[a] < sims[b])
    return separated, agree, ties


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="../shared/models/stories260K-hf")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=48)
    add_forward_option(parser)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calibration-rounds", type=int, default=4,
                        help="rounds of the calibration workload (more: a steadier fit)")
    parser.add_argument("--policies", default=None, help="comma list (default: all registered)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--trace", action="append", default=None, metavar="SPEC",
                        help="a trace window (README: Real traces) instead of the built-in "
                        "workloads; repeatable")
    parser.add_argument("--calibrate-on", default="default",
                        choices=("default", "next-window", "next-window-at-loads"),
                        help="with --trace: fit the simulator's profile on the built-in "
                        "calibration workload, or on each trace spec's next window (window=1, "
                        "all at t=0: the trace's step shapes, held out), or on that window "
                        "all at t=0 and replayed at each of --loads")
    parser.add_argument("--loads", default=[0.9, 1.2], type=positive_floats,
                        help="with --trace: multiples of the measured capacity (comma list)")
    arguments = parser.parse_args()
    for flag, check, values in (  # refused before the engine starts
            ("--policies", load_scheduler, (arguments.policies or "fcfs").split(",")),
            ("--trace", load_workload, arguments.trace or [])):
        for value in values:
            try:
                check(value)
            except ValueError as exc:
                parser.error(f"{flag}: {exc}")
    result = asyncio.run(main(arguments))
    if arguments.json:
        with open(arguments.json, "w") as f:
            json.dump(result, f, indent=1)
