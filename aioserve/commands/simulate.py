"""``aioserve simulate``: run and compare scheduling policies on a virtual clock (or on the
real engine), and report."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aioserve.commands.common import check_output, check_scheduler
from aioserve.commands.simulate_cluster import check_cluster, run_cluster, wants_cluster
from aioserve.commands.simulate_options import (
    SIMULATE,
    add_options,
    check_models,
    engine_config,
    load,
    old_spelling,
    policy_params,
    refuse_foreign,
    sim_config,
    with_model,
)
from aioserve.config import EngineConfig
from aioserve.reports.compare import format_comparison, plot_comparison, write_comparison_html
from aioserve.reports.figures import outcomes, policy_figures, rejection_warning
from aioserve.reports.policy_series import PolicySeries, series_png, series_table
from aioserve.reports.replay import FrameRecorder, write_html
from aioserve.reports.report import format_report, summarize
from aioserve.sim.simulator import SimResult, simulate, timing_line
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.trace_options import describe, split_spec

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        SIMULATE,
        help="run a workload through the engine and schedulers on a virtual clock",
        description="Reproduce the article's tables, compare policies without a model (on "
        "one replica or N behind a router), or run the same workload on the real engine "
        "(--real). Calibrating is aioserve calibrate; capacity is aioserve capacity.",
    )
    add_options(parser, SIMULATE)
    parser.add_argument("--calibrate", action="store_true", help=argparse.SUPPRESS)
    return parser


async def _run_all(args: argparse.Namespace, workload: list[WorkloadRequest], names: list[str],
                   params: dict[str, dict[str, Any] | None], real: EngineConfig | None,
                   series: dict[str, PolicySeries] | None = None,
                   ) -> tuple[list[SimResult], dict[str, FrameRecorder]]:
    results: list[SimResult] = []
    recorders: dict[str, FrameRecorder] = {}
    if real is not None:
        from aioserve.bench.throughput import started_engine
        from aioserve.sim.real import replay

        async with started_engine(real, args.random_model is None) as engine:
            await replay(engine, workload[: max(4, len(workload) // 8)], "fcfs")  # warm-up
            for name in names:
                results.append(await replay(engine, workload, name, params[name]))
        return results, recorders
    config = sim_config(args, workload)
    for name in names:
        recorder = FrameRecorder(f"simulated: {args.workload}") if args.html else None
        sampled = PolicySeries() if series is not None else None
        result = await simulate(workload, name, config, listener=recorder,
                                scheduler_params=params[name],
                                on_step=sampled.on_step if sampled is not None else None)
        results.append(result)
        if series is not None and sampled is not None:
            series[result.scheduler] = sampled
        if recorder is not None:
            recorders[result.scheduler] = recorder
    return results, recorders


def check(args: argparse.Namespace) -> None:
    """Every refusal of a simulation, named by its flag, before any model loads."""
    refuse_foreign(args, SIMULATE)
    for flag in ("--report", "--plot", "--html"):
        check_output(getattr(args, flag[2:]), flag)
    if args.report is not None and not args.compare:
        raise ValueError("--report: only with --compare (it writes its tables and plots as a "
                         "page; --html replays the slots)")
    if isinstance(args.real, str):  # --real MODEL: a directory, else a random shape
        if args.model or args.random_model is not None:
            raise ValueError("--real: give the model as --real MODEL, not also --model")
        if Path(args.real).is_dir():
            args.model = args.real
        else:
            args.random_model = args.real
    check_models(args)
    if (args.model or args.random_model is not None) and not args.real:
        raise ValueError("--model: only with --real (a simulation loads no model; give it the "
                         "--profile calibrated on one: aioserve calibrate)")


def run(args: argparse.Namespace) -> int:
    """Run ``simulate``; ValueError for an unknown scheduler, workload or option. The old
    spellings ``--calibrate``, ``--sweep-rate`` and ``--fewest-replicas`` run the command
    that replaced them, after a one-line notice."""
    from aioserve.commands import calibrate, capacity

    if args.calibrate:
        old_spelling("aioserve simulate --calibrate", "aioserve calibrate")
        if args.real:
            raise ValueError("--real: calibrating already runs the real engine")
        return calibrate.run(args)
    for dest, flag in (("sweep_rate", "--sweep-rate"), ("fewest_replicas", "--fewest-replicas")):
        if getattr(args, dest) is not None:
            old_spelling(f"aioserve simulate {flag}", f"aioserve capacity {flag}")
            return capacity.run(args)
    check(args)
    routers = check_cluster(args) if wants_cluster(args) else None
    names = capacity.policy_names(args.scheduler)
    params = policy_params(args.scheduler_config, names)
    for name in names:  # every policy refusal (and a state_path's folder) before any run
        check_scheduler(name, params[name])
    real = engine_config(args) if args.real else None
    workload = load(args)
    if Path(args.workload).exists() or Path(split_spec(args.workload)[0]).exists():
        print(f"workload: {describe(workload)}", file=sys.stderr)
    if routers is not None:
        return run_cluster(args, workload, params, sim_config(args, workload), *routers)
    if real is not None:
        real = with_model(args, real)
    series: dict[str, PolicySeries] | None = {} if args.report else None
    results, recorders = asyncio.run(_run_all(args, workload, names, params, real, series))
    for result in results:
        warning = rejection_warning(result.scheduler, outcomes(result))
        if warning is not None:
            print(warning, file=sys.stderr)
    kind = "real engine" if args.real else "simulated"
    timing = "timing: the real engine" if args.real else timing_line(results[0])
    if args.html and recorders:
        title = f"aioserve simulate: {args.workload}"
        print(f"html: {write_html(recorders, args.html, title)}", file=sys.stderr)
    if args.compare:
        runs = [policy_figures(r, args.slo_ttft_ms, args.slo_tpot_ms) for r in results]
        print(format_comparison(runs, f"{kind}: {args.workload}\n{timing}"))
        if args.report:
            over_time = series or {}  # the simulator's only (--real: none)
            path = write_comparison_html(
                runs, args.report, f"aioserve: {args.workload}", kind,
                [series_table(over_time)] if any(s.series for s in over_time.values()) else [],
                {"policy report() over time": lambda: series_png(over_time)})
            print(f"report: {path}", file=sys.stderr)
        if args.plot:
            plot_comparison(runs, args.plot, f"{kind}: {args.workload}")
            print(f"plot: {args.plot}", file=sys.stderr)
        if args.json:
            for run_figures in runs:
                print(json.dumps(run_figures))
        return 0
    print(textwrap.fill(timing, 100, subsequent_indent="  "),
          file=sys.stderr if args.json else sys.stdout)
    summaries = [summarize(result, args.workload) for result in results]
    if args.plot:
        from aioserve.reports.plots import plot

        try:
            path = plot(results, summaries, args.plot, f"{kind}: {args.workload}")
            print(f"plot: {path}", file=sys.stderr)
        except ImportError as exc:
            raise ValueError(f"--plot needs matplotlib: pip install 'aioserve[plots]' "
                             f"({exc})") from None
    for summary in summaries:
        print(json.dumps(summary) if args.json else format_report(summary) + "\n")
    return 0
