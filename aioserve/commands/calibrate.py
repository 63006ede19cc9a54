"""``aioserve calibrate``: fit the simulator's step cost on this machine's engine, in process
or from a served engine's step log."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from aioserve.commands.common import check_output
from aioserve.commands.simulate_options import (
    CALIBRATE,
    add_options,
    check_models,
    engine_config,
    refuse_foreign,
    with_model,
)
from aioserve.config import EngineConfig
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import load_workload

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers
    from aioserve.sim.step_cost import StepCostModel

#: The options a step log fixes (the engine that ran it).
_ENGINE = ("workload", "slots", "kv_blocks", "block_size", "max_model_len",
           "max_num_batched_tokens", "enable_prefix_caching", "forward", "device", "repeats")


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        CALIBRATE, help="fit the simulator's step cost on this machine (a --profile)",
        description="Run a short workload on the real engine (--model or --random-model) and "
        "fit the step cost, or fit it on a served engine's step log (--from-steps); writes "
        "--profile-out for aioserve simulate --profile and aioserve capacity --profile.")
    add_options(parser, CALIBRATE)
    return parser


def check(args: argparse.Namespace) -> None:
    """Every refusal of a calibration, named by its flag, before any model loads."""
    refuse_foreign(args, CALIBRATE)
    check_output(args.profile_out, "--profile-out")
    check_models(args)
    if args.from_steps is None:
        return
    if args.model or args.random_model is not None:
        raise ValueError("--from-steps: the step log names its model; give no --model or "
                         "--random-model")
    defaults = argparse.ArgumentParser()
    add_options(defaults, CALIBRATE)
    for dest in _ENGINE:
        if getattr(args, dest) != defaults.get_default(dest):
            raise ValueError(f"--{dest.replace('_', '-')}: not with --from-steps (the step "
                             "log records the engine that ran; engine options apply when "
                             "simulating with --profile)")
    path = Path(args.from_steps)
    if not path.is_file():
        what = "a directory, not a file:" if path.is_dir() else "no file"
        raise ValueError(f"--from-steps: {what} {args.from_steps!r}")


async def _calibrate(args: argparse.Namespace, real: EngineConfig,
                     workload: list[WorkloadRequest] | None) -> int:
    from aioserve.bench.throughput import started_engine
    from aioserve.sim.calibrate import calibrate
    from aioserve.sim.fit_report import format_fit

    async with started_engine(real, args.random_model is None) as engine:
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


def _from_steps(args: argparse.Namespace) -> int:
    from aioserve.engine.step_log import read_step_log
    from aioserve.sim.fit_report import format_fit
    from aioserve.sim.step_cost import fit_profile

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


def run(args: argparse.Namespace) -> int:
    """Run ``calibrate``; ValueError naming the flag of a bad option."""
    check(args)
    if args.from_steps is not None:
        return _from_steps(args)
    real = engine_config(args)
    workload = None
    if args.workload != "article-example":
        try:
            workload = load_workload(args.workload)
        except ValueError as exc:
            raise ValueError(f"--workload: {exc}") from None
    return asyncio.run(_calibrate(args, with_model(args, real), workload))
