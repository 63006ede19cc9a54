"""``aioserve simulate``: compare scheduling policies on a virtual clock."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

from aioserve.sim.replay import FrameRecorder, write_html
from aioserve.sim.report import format_report, summarize
from aioserve.sim.simulator import SimConfig, SimResult, simulate
from aioserve.sim.workloads import load_workload

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


def _non_negative(value: str) -> float:
    number = float(value)
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Register the ``simulate`` command."""
    parser = subparsers.add_parser(
        "simulate",
        help="run a workload through the engine and schedulers on a virtual clock",
        description="Reproduce the article's tables and compare policies without a model.",
    )
    parser.add_argument(
        "--scheduler",
        default="fcfs",
        help="policy name or package.module:Class; a comma list compares several",
    )
    parser.add_argument(
        "--workload",
        default="article-example",
        help="article-example, article-mix, poisson[:n=,rate=,burst=,seed=] or FILE.jsonl",
    )
    parser.add_argument("--slots", type=_positive, default=4, help="slots (default 4)")
    parser.add_argument(
        "--step-ms",
        type=_non_negative,
        default=50.0,
        help="cost of one step in ms (default 50, the article's)",
    )
    parser.add_argument(
        "--prefill-ms-per-token",
        type=_non_negative,
        default=0.0,
        help="extra cost per prompt or recomputed token in ms (default 0)",
    )
    parser.add_argument(
        "--kv-blocks",
        type=_positive,
        default=None,
        help="KV cache size in blocks (default: unlimited)",
    )
    parser.add_argument("--block-size", type=_positive, default=16, help="tokens per KV block")
    parser.add_argument(
        "--max-num-batched-tokens",
        type=_positive,
        default=4096,
        help="token budget of one step (default 4096)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="share cached prompt prefixes (workload prefix_group/prefix_len; default off)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per scheduler as the last line(s)",
    )
    parser.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="slot timeline per scheduler, plus a latency CDF for several",
    )
    parser.add_argument(
        "--html",
        default=None,
        metavar="FILE.html",
        help="a self-contained page replaying each run's slots step by step "
        "(time slider; a policy selector when comparing several)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``simulate``; exit status 0.

    Raises:
        ValueError: unknown scheduler or workload (the CLI prints it and exits 2).
    """
    workload = load_workload(args.workload)
    config = SimConfig(
        slots=args.slots,
        step_ms=args.step_ms,
        prefill_ms_per_token=args.prefill_ms_per_token,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    names = [name.strip() for name in args.scheduler.split(",") if name.strip()]
    if not names:
        raise ValueError("--scheduler: give at least one policy")
    results: list[SimResult] = []
    summaries: list[dict[str, Any]] = []
    recorders: dict[str, FrameRecorder] = {}
    for name in names:
        recorder = FrameRecorder(f"simulated: {args.workload}") if args.html else None
        result = asyncio.run(simulate(workload, name, config, listener=recorder))
        results.append(result)
        summaries.append(summarize(result, args.workload))
        if recorder is not None:
            recorders[result.scheduler] = recorder
    if args.html:
        title = f"aioserve simulate: {args.workload}"
        print(f"html: {write_html(recorders, args.html, title)}", file=sys.stderr)
    if args.plot:
        from aioserve.sim.plots import plot

        try:
            print(f"plot: {plot(results, summaries, args.plot)}", file=sys.stderr)
        except ImportError as exc:
            raise ValueError(f"--plot needs matplotlib: pip install 'aioserve[plots]' "
                             f"({exc})") from None
    for summary in summaries:
        if args.json:
            print(json.dumps(summary))
        else:
            print(format_report(summary))
            print()
    return 0
