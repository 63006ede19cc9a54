"""``aioserve generate PROMPT``: stream one continuation to stdout."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING

from aioserve.commands.common import add_engine_options, engine_config, flag_error
from aioserve.commands.preflight import GENERATE, preflight
from aioserve.config import EngineConfig
from aioserve.engine import AsyncEngine
from aioserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("generate", help="stream a continuation of PROMPT to stdout")
    parser.add_argument("prompt", help="the text to continue")
    add_engine_options(parser)
    parser.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest; 0: all")
    parser.add_argument(
        "--sampling-seed",
        "--request-seed",
        dest="request_seed",
        type=int,
        default=None,
        help="per-request sampling seed (default: the engine's --seed)",
    )
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", help="generate past EOS")
    parser.add_argument("--stats", action="store_true", help="print tokens/s to stderr")
    return parser


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The request's sampling parameters; ValueError naming the option."""
    try:
        return SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.request_seed if args.request_seed is not None else args.seed,
            stop=tuple(args.stop),
            ignore_eos=args.ignore_eos,
        )
    except ValueError as exc:
        raise flag_error(exc, args) from None


async def _generate(args: argparse.Namespace, config: EngineConfig,
                    params: SamplingParams) -> int:
    async with AsyncEngine(config) as engine:
        start = time.perf_counter()
        tokens = 0
        async for out in engine.generate(args.prompt, params):
            sys.stdout.write(out.text)
            sys.stdout.flush()
            tokens = out.num_output_tokens
        sys.stdout.write("\n")
        elapsed = time.perf_counter() - start
        if args.stats:
            print(
                f"{tokens} tokens in {elapsed:.3f} s = {tokens / elapsed:.1f} tokens/s",
                file=sys.stderr,
            )
    return 0


def run(args: argparse.Namespace) -> int:
    """Stream the continuation to stdout; options are checked before torch loads."""
    config, params = engine_config(args), sampling_params(args)
    preflight(args, GENERATE)
    return asyncio.run(_generate(args, config, params))
