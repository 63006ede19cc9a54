"""``aioserve simulate``: compare scheduling policies on a virtual clock, or calibrate."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aioserve.commands.common import check_scheduler, scheduler_params
from aioserve.commands.simulate_cluster import (
    add_cluster_options,
    check_cluster,
    run_cluster,
    wants_cluster,
)
from aioserve.commands.simulate_options import (
    add_options,
    check_combinations,
    engine_config,
    sim_config,
    slo_title,
    with_model,
)
from aioserve.config import EngineConfig
from aioserve.reports.compare import format_comparison, plot_comparison, write_comparison_html
from aioserve.reports.figures import policy_figures
from aioserve.reports.replay import FrameRecorder, write_html
from aioserve.reports.report import format_report, summarize
from aioserve.scheduling.registry import params_by_policy
from aioserve.sim.simulator import SimResult, simulate, timing_line
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import load_workload
from aioserve.workloads.trace_options import describe, split_spec

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers
    from aioserve.engine import AsyncEngine
    from aioserve.sim.step_cost import StepCostModel


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="run a workload through the engine and schedulers on a virtual clock",
        description="Reproduce the article's tables, compare policies without a model, "
        "calibrate the simulator on this machine (--calibrate) or run the same workload on "
        "the real engine (--real).",
    )
    add_options(parser)
    add_cluster_options(parser)
    return parser


def policy_params(text: str | None, names: list[str]) -> dict[str, dict[str, Any] | None]:
    """Each policy's parameters from ``--scheduler-config``; ValueError for an unknown key."""
    return params_by_policy(names, scheduler_params(text))


@contextlib.asynccontextmanager
async def real_engine(config: EngineConfig, tokenizer: bool = True) -> AsyncIterator[AsyncEngine]:
    """The started engine of ``config``; ``tokenizer=False`` loads none (a random model)."""
    from aioserve.engine import AsyncEngine

    runner = None
    if not tokenizer:  # an engine given its runner loads no tokenizer
        from aioserve.runners.torch.runner import TorchRunner

        runner = await asyncio.to_thread(TorchRunner, config)
    try:
        async with AsyncEngine(config, runner=runner) as engine:
            yield engine
    finally:
        if runner is not None:  # also when the engine failed to start
            runner.close()


async def _run_all(args: argparse.Namespace, workload: list[WorkloadRequest], names: list[str],
                   real: EngineConfig | None,
                   ) -> tuple[list[SimResult], dict[str, FrameRecorder]]:
    params = policy_params(args.scheduler_config, names)
    results: list[SimResult] = []
    recorders: dict[str, FrameRecorder] = {}
    if real is not None:
        from aioserve.sim.real import replay

        async with real_engine(real, args.random_model is None) as engine:
            await replay(engine, workload[: max(4, len(workload) // 8)], "fcfs")  # warm-up
            for name in names:
                results.append(await replay(engine, workload, name, params[name]))
        return results, recorders
    config = sim_config(args, workload)
    for name in names:
        recorder = FrameRecorder(f"simulated: {args.workload}") if args.html else None
        result = await simulate(workload, name, config, listener=recorder,
                                scheduler_params=params[name])
        results.append(result)
        if recorder is not None:
            recorders[result.scheduler] = recorder
    return results, recorders


async def _calibrate(args: argparse.Namespace, real: EngineConfig,
                     workload: list[WorkloadRequest] | None) -> int:
    from aioserve.sim.calibrate import calibrate
    from aioserve.sim.fit_report import format_fit

    async with real_engine(real, args.random_model is None) as engine:
        model = await calibrate(engine, workload, rounds=args.repeats)
    if args.random_model is not None:
        model.source["random_model"] = args.random_model
    path = _save(model, args.profile_out)
    print(format_fit(model))
    print(f"forward: {model.source.get('forward')}, device: {model.source.get('device')}")
    print(f"profile: {path} (use: aioserve simulate --profile {path} ...)")
    return 0


def _save(model: StepCostModel, path: str) -> Path:
    """``model`` written to ``path``; ValueError naming ``--profile-out`` when it cannot be."""
    try:
        return model.save(path)
    except OSError as exc:
        raise ValueError(f"--profile-out: cannot write {path}: {exc.strerror or exc}") from None


def _calibrate_from_steps(args: argparse.Namespace) -> int:
    from aioserve.sim.fit_report import format_fit
    from aioserve.sim.step_cost import fit_profile
    from aioserve.sim.step_log import read_step_log

    try:
        engine, steps = read_step_log(args.from_steps)
        model = fit_profile(steps, source={**engine, "step_log": str(args.from_steps)})
    except ValueError as exc:
        raise ValueError(f"--from-steps: {exc}") from None
    path = _save(model, args.profile_out)
    print(format_fit(model))
    print(f"fitted on {len(steps)} served steps of {engine.get('model')} "
          f"({engine.get('slots')} slots, {engine.get('kv_blocks')} KV blocks)")
    print(f"profile: {path} (use: aioserve simulate --profile {path} ...)")
    return 0


def _sweep(args: argparse.Namespace, names: list[str]) -> int:
    """``--sweep-rate``: each policy's attainment and goodput against rate, and its capacity."""
    from aioserve.reports.sweep import (
        format_sweep,
        plot_sweep,
        simulate_sweep,
        write_sweep_html,
    )
    from aioserve.sim.capacity import parse_rates

    if args.real or args.calibrate:
        raise ValueError("--sweep-rate simulates; against the real engine use a server and "
                         "aioserve bench serve --sweep-rate")
    if not 0 < args.target_attainment <= 1:
        raise ValueError("--target-attainment: must be in (0, 1]")
    rates = parse_rates(args.sweep_rate)
    params = policy_params(args.scheduler_config, names)
    curves = asyncio.run(simulate_sweep(
        args.workload, names, rates, args.sweep_repeats, lambda w: sim_config(args, w),
        args.slo_ttft_ms, args.slo_tpot_ms, params))
    target = args.target_attainment
    title = f"simulated: {args.workload}; {slo_title(args)}; {args.sweep_repeats} repeats"
    if args.profile:
        title += f"; profile {args.profile}"
    print(format_sweep(curves, target, title))
    if args.plot:
        plot_sweep(curves, target, args.plot, f"simulated: {args.workload}")
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.report:
        path = write_sweep_html(curves, target, args.report, f"aioserve capacity: "
                                f"{args.workload}", title)
        print(f"report: {path}", file=sys.stderr)
    if args.json:
        for curve in curves:
            print(json.dumps(curve.to_dict(target)))
    return 0


def _workload(args: argparse.Namespace) -> list[WorkloadRequest]:
    try:
        return load_workload(args.workload)
    except ValueError as exc:
        raise ValueError(f"--workload: {exc}") from None


def _policy_names(text: str) -> list[str]:
    """``--scheduler``'s comma list; ValueError when empty or a policy repeats."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("--scheduler: give at least one policy")
    repeated = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if repeated is not None:
        raise ValueError(f"--scheduler: {repeated!r} given twice")
    return names


def run(args: argparse.Namespace) -> int:
    """Run ``simulate``; ValueError for an unknown scheduler, workload or option."""
    check_combinations(args)
    routers = check_cluster(args) if wants_cluster(args) else None
    names = _policy_names(args.scheduler)
    if args.sweep_rate is not None:
        return _sweep(args, names)
    if args.from_steps is not None:
        return _calibrate_from_steps(args)
    real = engine_config(args) if args.calibrate or args.real else None
    if args.calibrate and real is not None:
        workload = _workload(args) if args.workload != "article-example" else None
        return asyncio.run(_calibrate(args, with_model(args, real), workload))
    workload = _workload(args)
    if Path(args.workload).exists() or Path(split_spec(args.workload)[0]).exists():
        print(f"workload: {describe(workload)}", file=sys.stderr)
    if routers is not None:
        return run_cluster(args, workload, names, sim_config(args, workload), *routers)
    if real is not None:  # every refusal before torch loads
        params = policy_params(args.scheduler_config, names)
        for name in names:
            check_scheduler(name, params[name])
        real = with_model(args, real)
    results, recorders = asyncio.run(_run_all(args, workload, names, real))
    kind = "real engine" if args.real else "simulated"
    timing = "timing: the real engine" if args.real else timing_line(results[0])
    if args.html and recorders:
        title = f"aioserve simulate: {args.workload}"
        print(f"html: {write_html(recorders, args.html, title)}", file=sys.stderr)
    if args.compare:
        runs = [policy_figures(r, args.slo_ttft_ms, args.slo_tpot_ms) for r in results]
        print(format_comparison(runs, f"{kind}: {args.workload}\n{timing}"))
        if args.report:
            path = write_comparison_html(runs, args.report, f"aioserve: {args.workload}", kind)
            print(f"report: {path}", file=sys.stderr)
        if args.plot:
            plot_comparison(runs, args.plot, f"{kind}: {args.workload}")
            print(f"plot: {args.plot}", file=sys.stderr)
        if args.json:
            for run_figures in runs:
                print(json.dumps(run_figures))
        return 0
    print(timing, file=sys.stderr if args.json else sys.stdout)
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
