"""The options of ``aioserve simulate``, for the simulated engine and the real one."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from aioserve.commands.common import (
    add_forward_option,
    add_scheduler_options,
    check_device,
    check_model,
    check_output,
    flag_error,
    non_negative_float,
    positive_int,
)
from aioserve.config import EngineConfig
from aioserve.sim.simulator import SimConfig
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.request import WorkloadRequest


def add_options(parser: argparse.ArgumentParser) -> None:
    add_scheduler_options(parser)
    parser.set_defaults(scheduler="fcfs")
    add = parser.add_argument
    add("--workload", default="article-example",
        help="article-example, article-mix, poisson[:n=,rate=,burst=,seed=], two-tenants, "
        "priority-mix, slo-mix, heavy-tail, routes, shared-prefix (each with :key=value "
        "options; a bad key lists them), or a trace or "
        "workload file: FILE[:start=,duration=,n=,window=,rate=|speed=,burstiness=,seed=,"
        "len_scale=,max_len=] (Azure CSV, Mooncake JSONL or aioserve JSONL; README: Real "
        "traces)")
    add("--slots", type=positive_int, default=None,
        help="slots (default 4, or the profile's)")
    add("--step-ms", type=non_negative_float, default=50.0,
        help="cost of one step in ms (default 50, the article's; a --profile replaces it)")
    add("--prefill-ms-per-token", type=non_negative_float, default=0.0,
        help="extra cost per prompt or recomputed token in ms (default 0)")
    add("--kv-blocks", type=positive_int, default=None,
        help="KV cache size in blocks (default: a full context per slot, or the profile's)")
    add("--max-model-len", type=positive_int, default=None,
        help="context length in tokens (default 2048, or the profile's): a request's "
        "max_tokens defaults to what is left of it, never to its true length")
    add("--block-size", type=positive_int, default=None,
        help="tokens per KV block (default 16, or the profile's)")
    add("--max-num-batched-tokens", type=positive_int, default=None,
        help="token budget of one step (default 4096, or the profile's)")
    add("--enable-prefix-caching", action="store_true",
        help="share cached prompt prefixes (workload prefix_group/prefix_len; default off)")
    add("--profile", default=None, metavar="FILE.json",
        help="a calibrated step cost (from --calibrate): simulate this engine on this machine "
        "(one step ahead, as the engine schedules; its slots and cache unless given)")
    add("--overlap", action=argparse.BooleanOptionalAction, default=None,
        help="schedule one step ahead as the engine does (default: on with --profile)")
    add("--calibrate", action="store_true",
        help="run a short workload on the real engine (--model) and fit the step cost; "
        "writes --profile-out")
    add("--from-steps", default=None, metavar="FILE.jsonl",
        help="--calibrate: fit on a served engine's steps (aioserve serve --step-log FILE) "
        "instead of running --model here")
    add("--profile-out", default="profile.json", metavar="FILE.json",
        help="where --calibrate writes the profile (default profile.json)")
    add("--real", action="store_true",
        help="run the workload on the real engine (--model) instead of simulating it")
    add("--repeats", type=positive_int, default=2, help="--calibrate: passes to fit on (2)")
    add("--model", default=None, help="model directory, for --real and --calibrate")
    add("--random-model", default=None, metavar="CONFIG",
        help="instead of --model: random weights of a real shape, as bench throughput's "
        "(a transformers config.json or a shipped shape: smollm2-135m, qwen3-0.6b)")
    add_forward_option(parser, "; --real and --calibrate: the engine's, as serve's")
    add("--device", default="auto", help="the engine's device (--real, --calibrate)")
    add("--compare", action="store_true",
        help="print the policy comparison: throughput, goodput, TTFT/TPOT/E2E, per-tenant "
        "service and Jain's index, max wait, preemptions, recomputed tokens")
    add("--slo-ttft-ms", type=non_negative_float, default=None,
        help="--compare, --sweep-rate: TTFT objective of requests that carry none")
    add("--slo-tpot-ms", type=non_negative_float, default=None,
        help="--compare, --sweep-rate: TPOT objective of requests that carry none")
    _add_sweep_options(parser)
    add("--report", default=None, metavar="FILE.html",
        help="--compare, --sweep-rate: also write the comparison as a self-contained HTML page")
    add("--json", action="store_true",
        help="print one JSON object per scheduler as the last line(s)")
    add("--plot", default=None, metavar="FILE.png",
        help="slot timeline per scheduler and a latency CDF (with --compare: the comparison)")
    add("--html", default=None, metavar="FILE.html",
        help="a self-contained page replaying each run's slots step by step "
        "(time slider; a policy selector when comparing several)")


def _add_sweep_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--sweep-rate", default=None, metavar="LO:HI[:N]",
        help="capacity search: run the workload at N rates (default 5; 1 when LO = HI) from "
        "LO to HI req/s and report per policy SLO attainment, goodput and the highest rate "
        "meeting --target-attainment (needs a workload with a rate: poisson, a scenario or a "
        "file)")
    add("--sweep-repeats", type=positive_int, default=3,
        help="--sweep-rate: runs per rate, other seeds or a file's next windows (default 3)")
    add("--target-attainment", type=non_negative_float, default=0.9,
        help="--sweep-rate: the SLO attainment to meet, 0-1 (default 0.9)")
    add("--max-concurrency", type=positive_int, default=None,
        help="most requests in the engine at once; later arrivals wait for one to finish, "
        "as vLLM bench's --max-concurrency (default: no limit)")


def _profile(args: argparse.Namespace) -> StepCostModel | None:
    """The ``--profile`` step cost, or None; ValueError naming ``--profile`` and what is wrong."""
    if not args.profile:
        return None
    try:
        return StepCostModel.load(args.profile)
    except OSError as exc:
        raise ValueError(f"--profile {args.profile}: cannot read it: "
                         f"{exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"--profile {args.profile}: not a step-cost profile: {exc}") from None


def sim_config(args: argparse.Namespace, workload: list[WorkloadRequest]) -> SimConfig:
    """The simulated engine of the options (a profile's where options are unset)."""
    model = _profile(args)
    source = model.source if model is not None else {}

    def pick(value: int | None, key: str, default: int | None) -> int | None:
        return value if value is not None else source.get(key, default)

    overlap = args.overlap if args.overlap is not None else model is not None
    return SimConfig(
        slots=pick(args.slots, "slots", 4) or 4, step_ms=args.step_ms,
        prefill_ms_per_token=args.prefill_ms_per_token,
        kv_blocks=pick(args.kv_blocks, "kv_blocks", None),
        block_size=pick(args.block_size, "block_size", 16) or 16,
        max_num_batched_tokens=pick(args.max_num_batched_tokens, "max_num_batched_tokens",
                                    4096) or 4096,
        enable_prefix_caching=args.enable_prefix_caching or bool(
            source.get("enable_prefix_caching", False)),
        cost_model=model, overlap=overlap,
        max_model_len=pick(args.max_model_len, "max_model_len", None),
        max_concurrency=args.max_concurrency,
    )


def check_combinations(args: argparse.Namespace) -> None:
    """ValueError naming the flag of a combination that cannot run (before any model loads)."""
    for flag in ("--report", "--plot", "--html"):
        check_output(getattr(args, flag[2:]), flag)
    if args.calibrate:
        check_output(args.profile_out, "--profile-out")
    if args.report is not None and not (args.compare or args.sweep_rate is not None):
        raise ValueError("--report: only with --compare or --sweep-rate (it writes their "
                         "tables and plots as a page; --html replays the slots)")
    if args.from_steps is not None:
        if not args.calibrate:
            raise ValueError("--from-steps: only with --calibrate (it fits a profile)")
        if args.model or args.random_model is not None:
            raise ValueError("--from-steps: the step log names its model; give no --model or "
                             "--random-model")
        if args.real:
            raise ValueError("--real: not with --from-steps (it fits on steps already run)")
        defaults = argparse.ArgumentParser()
        add_options(defaults)
        for dest in ("workload", "slots", "kv_blocks", "block_size", "max_model_len",
                     "max_num_batched_tokens", "enable_prefix_caching", "forward", "device",
                     "repeats"):
            if getattr(args, dest) != defaults.get_default(dest):
                raise ValueError(f"--{dest.replace('_', '-')}: not with --from-steps (the step "
                                 "log records the engine that ran; engine options apply when "
                                 "simulating with --profile)")
        path = Path(args.from_steps)
        if not path.is_file():
            what = "a directory, not a file:" if path.is_dir() else "no file"
            raise ValueError(f"--from-steps: {what} {args.from_steps!r}")
    if args.calibrate and args.real:
        raise ValueError("--real: --calibrate already runs the real engine; give one of them")
    if args.calibrate and args.profile:
        raise ValueError("--profile: --calibrate writes a profile (to --profile-out), it reads "
                         "none")
    if args.random_model is not None:
        if args.model:
            raise ValueError("--random-model: give --model or --random-model, not both")
        if not (args.calibrate or args.real):
            raise ValueError("--random-model: only with --calibrate or --real (a simulation "
                             "loads no model; give it the --profile calibrated on one)")
        from aioserve.bench.models.random_model import read_shape

        read_shape(args.random_model)  # names --random-model


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The real engine of the options; ValueError naming the option. With ``--random-model``
    its ``model`` is the shape's name until :func:`with_model` builds it."""
    if args.random_model is None:
        if not args.model:
            raise ValueError("--model: give the model to run (--random-model for random "
                             "weights; needed by --real and --calibrate)")
        check_model(args.model)
    check_device(args.device)
    try:
        return EngineConfig(
            model=args.model or args.random_model, scheduler="fcfs", max_num_seqs=args.slots or 4,
            max_model_len=args.max_model_len,
            num_kv_blocks=args.kv_blocks,
            block_size=args.block_size or 16,
            max_num_batched_tokens=args.max_num_batched_tokens or 4096,
            enable_prefix_caching=args.enable_prefix_caching, forward=args.forward,
            device=args.device,
        )
    except ValueError as exc:
        raise flag_error(exc, args) from None


def with_model(args: argparse.Namespace, config: EngineConfig) -> EngineConfig:
    """``config`` with its random model built (cached) where ``--random-model`` is given."""
    if args.random_model is None:
        return config
    from aioserve.bench.models.random_model import ensure_random_model

    return replace(config, model=str(ensure_random_model(args.random_model)))


def slo_title(args: argparse.Namespace) -> str:
    """The objectives of a run's title: the flags given, after the workload's own."""
    given = [f"{name} {value:g} ms" for name, value in
             (("TTFT", args.slo_ttft_ms), ("TPOT", args.slo_tpot_ms)) if value is not None]
    return (f"SLO {', '.join(given)} where a request carries none" if given
            else "the requests' own SLOs")
