"""The options of ``aioserve simulate``, for the simulated engine and the real one."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from aioserve.commands.common import (
    check_device,
    check_model,
    flag_error,
    non_negative_float,
    positive_float,
    positive_int,
    scheduler_params,
)
from aioserve.config import EngineConfig
from aioserve.routing.registry import BUILTIN_ROUTERS
from aioserve.runners.attention import registry as attention_registry
from aioserve.scheduling.registry import params_by_policy
from aioserve.sim.simulator import SimConfig
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import load_workload

#: The lab's commands; every option of the three is known to each, so that one given to the
#: wrong command is refused naming the command that takes it.
SIMULATE, CALIBRATE, CAPACITY = "simulate", "calibrate", "capacity"
#: dest -> the commands that take it (where it is listed in their --help).
TAKEN_BY: dict[str, tuple[str, ...]] = {}
#: dest -> the commands that take it without listing it (a --profile usually sets it).
UNLISTED_IN: dict[str, tuple[str, ...]] = {}
_LAB = (SIMULATE, CALIBRATE, CAPACITY)


def add_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Every lab option on ``parser``; those ``command`` does not take are hidden."""

    def add(flag: str, listed: tuple[str, ...], *args: Any, unlisted: tuple[str, ...] = (),
            **kwargs: Any) -> None:
        dest = flag[2:].replace("-", "_")
        TAKEN_BY[dest], UNLISTED_IN[dest] = (*listed, *unlisted), unlisted
        if command not in listed:
            kwargs["help"] = argparse.SUPPRESS
        parser.add_argument(flag, *args, **kwargs)

    sim, cap, cal = (SIMULATE,), (CAPACITY,), (CALIBRATE,)
    add("--scheduler", (SIMULATE, CAPACITY), default="fcfs",
        help="comma-separated policies (fcfs, static, spf, memory_aware, priority, vtc, edf, "
        "mlfq, an entry point or package.module:Class)")
    add("--scheduler-config", (SIMULATE, CAPACITY), default=None, metavar="JSON",
        help="the policies' parameters as a JSON object, one for all or keyed by policy")
    add("--workload", _LAB, default="article-example",
        help="article-example, article-mix, poisson[:n=,rate=,burst=,seed=], two-tenants, "
        "priority-mix, slo-mix, heavy-tail, routes, shared-prefix (:key=value options), or a "
        "trace or workload file FILE[:start=,duration=,n=,window=,rate=|speed=,burstiness=,"
        "seed=,len_scale=,max_len=] (Azure CSV, Mooncake JSONL, aioserve JSONL)")
    add("--profile", (SIMULATE, CAPACITY), default=None, metavar="FILE.json",
        help="a calibrated step cost (aioserve calibrate): this engine on this machine, one "
        "step ahead; its slots and cache unless given")
    add("--slots", (SIMULATE, CALIBRATE), type=positive_int, default=None, unlisted=cap,
        help="slots (default 4, or the profile's)")
    add("--kv-blocks", (SIMULATE, CALIBRATE), type=positive_int, default=None, unlisted=cap,
        help="KV cache size in blocks (default: a full context per slot, or the profile's)")
    add("--max-model-len", (SIMULATE, CALIBRATE), type=positive_int, default=None,
        unlisted=cap, help="context length in tokens (default 2048, or the profile's): "
        "max_tokens defaults to what is left of it, never to the true length")
    add("--step-ms", sim, type=non_negative_float, default=50.0, unlisted=cap,
        help="cost of one step in ms (default 50, the article's; a --profile replaces it)")
    add("--prefill-ms-per-token", (), type=non_negative_float, default=0.0,
        unlisted=(SIMULATE, CAPACITY), help="extra cost per prompt or recomputed token, ms")
    add("--block-size", cal, type=positive_int, default=None, unlisted=(SIMULATE, CAPACITY),
        help="tokens per KV block (default 16, or the profile's)")
    add("--max-num-batched-tokens", cal, type=positive_int, default=None,
        unlisted=(SIMULATE, CAPACITY), help="token budget of one step (default 4096)")
    add("--enable-prefix-caching", (SIMULATE, CALIBRATE), action="store_true", unlisted=cap,
        help="share cached prompt prefixes (default off)")
    add("--overlap", (), action=argparse.BooleanOptionalAction, default=None,
        unlisted=(SIMULATE, CAPACITY), help="schedule one step ahead (default: with --profile)")
    add("--max-concurrency", cap, type=positive_int, default=None, unlisted=sim,
        help="most requests in the engine at once; later arrivals wait for one to finish, as "
        "vLLM bench's --max-concurrency (default: no limit)")
    add("--max-waiting", cap, type=positive_int, default=None, unlisted=sim,
        help="the admission limit, as serve's: most requests waiting for a slot; one more "
        "is refused (queue_full), and the answer counts the refused (default: no limit)")
    add("--max-queue-time-s", cap, type=positive_float, default=None, unlisted=sim,
        help="the admission limit, as serve's: seconds a request may wait before it is first "
        "scheduled, then it is refused (queue_timeout) (default: no limit)")
    add("--real", sim, nargs="?", const=True, default=False, metavar="MODEL",
        help="run the workload on the real engine instead: a model directory, or random "
        "weights of a shape (smollm2-135m, qwen3-0.6b or a config.json)")
    add("--model", cal, default=None, unlisted=sim,
        help="the model directory to calibrate on")
    add("--random-model", cal, default=None, metavar="CONFIG", unlisted=sim,
        help="instead of --model: random weights of a real shape (a transformers config.json "
        "or smollm2-135m, qwen3-0.6b)")
    add("--forward", cal, default=EngineConfig.forward,
        choices=["auto", *attention_registry.FORWARDS], unlisted=sim,
        help="the engine's forward, as serve's")
    add("--device", cal, default="auto", unlisted=sim, help="the engine's device")
    add("--from-steps", cal, default=None, metavar="FILE.jsonl",
        help="fit on a served engine's steps (aioserve serve --step-log FILE) instead of "
        "running --model here")
    add("--profile-out", cal, default="profile.json", metavar="FILE.json",
        help="where the profile is written")
    add("--repeats", cal, type=positive_int, default=2, help="passes to fit on")
    add("--replicas", sim, type=positive_int, default=None,
        help="simulate N replicas behind a router (a table per router)")
    add("--router", (SIMULATE, CAPACITY), default=None,
        help=f"comma-separated routers ({', '.join(BUILTIN_ROUTERS)}, an entry point or "
        "package.module:Class; default round_robin)")
    add("--router-config", (SIMULATE, CAPACITY), default=None, metavar="JSON",
        help="router parameters, one object for all or keyed by router")
    add("--compare", sim, action="store_true",
        help="print the policy comparison: throughput, goodput, SLO, TTFT/TPOT/E2E, fairness")
    add("--slo-ttft-ms", (SIMULATE, CAPACITY), type=non_negative_float, default=None,
        help="TTFT objective of requests that carry none")
    add("--slo-tpot-ms", (SIMULATE, CAPACITY), type=non_negative_float, default=None,
        help="TPOT objective of requests that carry none")
    add("--sweep-rate", cap, default=None, metavar="LO:HI[:N]",
        help="run the workload at N rates (default 5) from LO to HI req/s: SLO attainment, "
        "goodput and the highest rate meeting --target-attainment")
    add("--sweep-repeats", cap, type=positive_int, default=3,
        help="runs per rate: other seeds or a file's next windows")
    add("--arrivals", cap, choices=["scale", "redraw"], default=None,
        help="a trace at a rate: scale its own gaps in time, or redraw Poisson arrivals at "
        "that rate (default: scale; the answer names which)")
    add("--target-attainment", cap, type=non_negative_float, default=0.9,
        help="the SLO attainment to meet, 0-1")
    add("--fewest-replicas", cap, type=positive_int, default=None, metavar="MAX",
        help="instead of a rate: the fewest replicas (1..MAX) meeting --target-attainment at "
        "the workload's rate, per policy and router")
    add("--url", cap, default=None,
        help="sweep a running server instead (its key from $OPENAI_API_KEY or "
        "$AIOSERVE_API_KEY)")
    add("--report", (SIMULATE, CAPACITY), default=None, metavar="FILE.html",
        help="also write the tables and plots as a self-contained HTML page (simulate: with "
             "each policy's report() over virtual time)")
    add("--json", (SIMULATE, CAPACITY), action="store_true",
        help="print one JSON object per run as the last line(s)")
    add("--plot", (SIMULATE, CAPACITY), default=None, metavar="FILE.png",
        help="a PNG: slot timelines and latency CDF (with --compare: the comparison; "
        "capacity: the curves)")
    add("--html", sim, default=None, metavar="FILE.html",
        help="a self-contained page replaying each run's slots step by step")
    unlisted = sorted(f"--{dest.replace('_', '-')}" for dest, where in UNLISTED_IN.items()
                      if command in where)
    if unlisted:
        parser.epilog = (f"also taken (usually set by a --profile, for the real engine, or "
                         f"an admission limit as serve's): {', '.join(unlisted)}")


def refuse_foreign(args: argparse.Namespace, command: str) -> None:
    """ValueError naming the option and the command that takes it, for an option given to
    ``command`` that it does not take (checked before any work)."""
    defaults = argparse.ArgumentParser()
    add_options(defaults, command)
    for dest, where in TAKEN_BY.items():
        if command in where or getattr(args, dest) == defaults.get_default(dest):
            continue
        flag = f"--{dest.replace('_', '-')}"
        others = " or ".join(f"aioserve {c}" for c in where) or "no lab command"
        raise ValueError(f"{flag}: not an option of aioserve {command}; {others} takes it")


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
        max_concurrency=args.max_concurrency, max_waiting=args.max_waiting,
        max_queue_time_s=args.max_queue_time_s,
    )


def check_models(args: argparse.Namespace) -> None:
    """ValueError naming ``--model`` or ``--random-model`` when both are given or the shape
    is unknown (before any model loads)."""
    if args.random_model is not None:
        if args.model:
            raise ValueError("--random-model: give --model or --random-model, not both")
        from aioserve.bench.models.random_model import read_shape

        read_shape(args.random_model)  # names --random-model


def old_spelling(old: str, new: str) -> None:
    """The one-line notice of a spelling kept for one release."""
    print(f"aioserve: {old} is now {new} (this spelling goes in the next release)",
          file=sys.stderr)


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
            device=args.device, max_waiting=args.max_waiting,
            max_queue_time_s=args.max_queue_time_s,
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


def policy_params(text: str | None, names: list[str]) -> dict[str, dict[str, Any] | None]:
    """Each policy's parameters from ``--scheduler-config``; ValueError for an unknown key."""
    return params_by_policy(names, scheduler_params(text))


def load(args: argparse.Namespace) -> list[WorkloadRequest]:
    """The ``--workload``'s requests; ValueError naming the flag."""
    try:
        return load_workload(args.workload)
    except ValueError as exc:
        raise ValueError(f"--workload: {exc}") from None
