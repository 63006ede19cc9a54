"""``aioserve bench throughput | serve | overhead``: the benchmarks."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aioserve.commands.common import (
    add_prefix_caching_option,
    add_runner_options,
    check_device,
    check_model,
    check_output,
    check_scheduler,
    non_negative_float,
    positive_float,
    positive_int,
    token_range,
)
from aioserve.commands.preflight import BENCH_SERVE, preflight
from aioserve.config import EngineConfig
from aioserve.runners.cpu.native_dtypes import check_dtype
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.synthetic import (
    prefix_repetition_requests,
    random_requests,
)

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers


def _workload_options(parser: argparse.ArgumentParser, prompts: int) -> None:
    parser.add_argument("--num-prompts", type=positive_int, default=prompts, help="requests")
    parser.add_argument("--input-len", type=token_range, default=(8, 128),
                        help="prompt tokens LO:HI, uniform, BOS included")
    parser.add_argument("--output-len", type=token_range, default=(16, 256),
                        help="output tokens LO:HI, uniform, EOS ignored")
    parser.add_argument("--dataset", choices=["random", "prefix-repetition"], default="random",
                        help="random prompts, or groups sharing a prefix (vLLM's "
                             "prefix_repetition; --input-len is then unused)")
    parser.add_argument("--prefix-len", type=int, default=256,
                        help="prefix-repetition: shared prefix tokens, BOS included")
    parser.add_argument("--suffix-len", type=int, default=32,
                        help="prefix-repetition: unique tokens after the prefix")
    parser.add_argument("--num-prefixes", type=int, default=4,
                        help="prefix-repetition: groups, one prefix each")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _add_throughput(sub: Any) -> None:
    p = sub.add_parser("throughput", help="offline: every request at t=0")
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="model directory or hub id")
    model.add_argument("--random-model", metavar="CONFIG",
                       help="random weights of a real shape: a transformers config.json, or "
                            "a shipped shape (smollm2-135m, qwen3-0.6b); built once, in the "
                            "config's torch_dtype (the shipped shapes: bfloat16, as their "
                            "checkpoints), into ~/.cache/aioserve/random-models/ (no "
                            "tokenizer)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer (default: the model's; none with --random-model)")
    p.add_argument("--scheduler", default="fcfs", help="policy name or package.module:Class")
    p.add_argument("--max-num-seqs", type=positive_int, default=32, help="slots")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=4096,
                   help="most tokens in one step")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: on the CPU the checkpoint's dtype where the CPU runs it "
                   "natively, else float32; bfloat16 on CUDA")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    add_prefix_caching_option(p)
    add_runner_options(p)
    _workload_options(p, 64)
    p.add_argument("--compare", choices=["hf-static", "no-prefix-caching"], default=None,
                   help="also run transformers generate() static batching, or aioserve "
                        "with the prefix cache off (runs alternate)")
    p.add_argument("--hf-batch-size", type=positive_int, default=32,
                   help="transformers' static batch size (with --compare hf-static)")
    p.add_argument("--runs", type=positive_int, default=1,
                   help="timed runs per backend, after one untimed warm-up pass of each; "
                        "medians reported")
    p.add_argument("--threads", type=int, default=None,
                   help="compute threads of each backend: transformers' intra-op threads and "
                        "aioserve's budget, shared by its step parts (default: each "
                        "backend's own, every core)")
    p.add_argument("--check", action="store_true",
                   help="compare every output with a solo transformers generate()")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(bench=_throughput)


def _add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="online: Poisson arrivals against a running server")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server to load")
    p.add_argument("--endpoint", choices=["auto", "completions", "ws"], default="auto",
                   help="POST /v1/completions (SSE) or GET /ws; auto probes /v1/models")
    p.add_argument("--served-model-name", default=None,
                   help="model name to send (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None,
                   help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY, "
                        "else $AIOSERVE_API_KEY, else none)")
    p.add_argument("--vocab-size", type=int, default=512, help="prompt ids are < this")
    p.add_argument("--request-rate", type=positive_float, default=math.inf,
                   help="requests/s, Poisson (inf: all at once)")
    p.add_argument("--slo-ttft-ms", type=non_negative_float, default=math.inf,
                   help="TTFT objective in ms, for goodput")
    p.add_argument("--slo-tpot-ms", type=non_negative_float, default=math.inf,
                   help="TPOT objective in ms, for goodput")
    p.add_argument("--plot", default=None, help="save latency plots to this file (PNG)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--workload", default=None, metavar="FILE.jsonl",
                   help="replay a simulator workload (a JSONL file, or a named one as "
                        "aioserve simulate --workload): its arrival times, prompt and output "
                        "lengths, priority, tenant (sent as user), objectives and metadata; "
                        "the random options are then unused; a trace with its options "
                        "(FILE[:n=,rate=,max_len=,...]; Mooncake prefix blocks become shared "
                        "token-id prefixes)")
    _workload_options(p, 100)
    _add_serve_arrivals(p)
    p.set_defaults(bench=_serve)


def _add_serve_arrivals(p: argparse.ArgumentParser) -> None:
    p.add_argument("--burstiness", type=positive_float, default=1.0,
                   help="random prompts: gamma arrivals of this shape at --request-rate "
                        "(default 1: Poisson; lower: burstier), as vLLM bench's")
    p.add_argument("--max-concurrency", type=positive_int, default=None,
                   help="most requests in flight; a later one is sent when one ends "
                        "(default: no limit)")
    p.add_argument("--sweep-rate", default=None, metavar="LO:HI[:N]",
                   help="capacity search on --workload: run it at N rates (default 5; 1 "
                        "when LO = HI) and report SLO attainment, goodput and the highest "
                        "rate meeting --target-attainment, as aioserve simulate --sweep-rate "
                        "does")
    p.add_argument("--sweep-repeats", type=positive_int, default=3,
                   help="--sweep-rate: runs per rate, other seeds or a file's next windows "
                        "(default 3)")
    p.add_argument("--target-attainment", type=non_negative_float, default=0.9,
                   help="--sweep-rate: the SLO attainment to meet, 0-1 (default 0.9)")


def _add_overhead(sub: Any) -> None:
    p = sub.add_parser("overhead", help="step-loop cost per step on a zero-cost runner")
    p.add_argument("--num-requests", type=positive_int, default=256,
                   help="requests decoding at once")
    p.add_argument("--num-steps", type=positive_int, default=200, help="steps measured per run")
    p.add_argument("--tokenizer", default=None, help="include detokenization with this tokenizer")
    p.add_argument("--runs", type=positive_int, default=3, help="runs; the median is reported")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(bench=_overhead)


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench", help="benchmarks: throughput, serve, overhead")
    sub = parser.add_subparsers(dest="bench_command", required=True)
    _add_throughput(sub)
    _add_serve(sub)
    _add_overhead(sub)
    return parser


def _prefix(args: argparse.Namespace) -> tuple[int, int, int] | None:
    """(prefix, suffix, groups) for the prefix-repetition dataset, else None."""
    if args.dataset != "prefix-repetition":
        return None
    return args.prefix_len, args.suffix_len, args.num_prefixes


def _requests(args: argparse.Namespace) -> list[WorkloadRequest]:
    if getattr(args, "workload", None):
        from aioserve.workloads.scenarios import load_workload

        try:
            return load_workload(args.workload)
        except ValueError as exc:
            raise ValueError(f"--workload: {exc}") from None
    prefix = _prefix(args)
    if prefix is None:
        return random_requests(args.num_prompts, args.input_len, args.output_len,
                               vocab_size=args.vocab_size, seed=args.seed)
    return prefix_repetition_requests(args.num_prompts, *prefix, args.output_len,
                                      vocab_size=args.vocab_size, seed=args.seed)


def _throughput(args: argparse.Namespace) -> int:
    model = args.model
    check_scheduler(args.scheduler, None)  # refusals before torch loads
    if args.random_model is None:
        check_model(model)
    check_device(args.device)
    check_dtype(args.dtype, args.device)
    from aioserve.bench.offline import run_offline

    if args.random_model is not None:
        from aioserve.bench.models.random_model import ensure_random_model

        model = str(ensure_random_model(args.random_model))  # ValueError: exit status 2
    config = EngineConfig(
        model=model, tokenizer=args.tokenizer, scheduler=args.scheduler,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        dtype=args.dtype, device=args.device, enable_prefix_caching=args.enable_prefix_caching,
        forward=args.forward, attention_backend=args.attention_backend,
        enforce_eager=args.enforce_eager, batch_invariant=args.batch_invariant,
    )
    report = run_offline(
        config, num_prompts=args.num_prompts, input_len=args.input_len,
        output_len=args.output_len, seed=args.seed, compare=args.compare, prefix=_prefix(args),
        hf_batch_size=args.hf_batch_size, runs=args.runs, threads=args.threads,
        check=args.check, progress=not args.no_progress and not args.json,
        tokenizer=args.random_model is None or args.tokenizer is not None,
    )
    report.workload["random_model"] = args.random_model
    if args.json:
        print(json.dumps(report.to_dict()))
        return 0
    prompt = (f"prefix {args.prefix_len} x {args.num_prefixes} + suffix {args.suffix_len}"
              if args.dataset == "prefix-repetition" else f"prompt {args.input_len}")
    if args.random_model is not None:
        print(f"random weights, shape {args.random_model}: {model}")
    print(f"{args.num_prompts} requests, {prompt}, output {args.output_len}, "
          f"{args.max_num_seqs} slots, compute threads "
          + ", ".join(f"{name} {count}" for name, count in report.threads.items()
                      if name in report.runs))
    for backend, results in report.runs.items():
        print(f"{report.warmups[backend].summary()}  (warm-up, not counted)")
        for result in results:
            print(result.summary())
        if len(results) > 1:
            print(f"   median  {report.median(backend).summary().strip()}")
    if report.ratio is not None:
        print(f"aioserve / {report.baseline} (output tokens/s, medians): {report.ratio:.2f}x")
    if report.baseline == "no-caching":
        on, off = report.median("aioserve"), report.median("no-caching")
        if on.mean_ttft_ms and off.mean_ttft_ms:
            print(f"mean TTFT no-caching / aioserve (medians): "
                  f"{off.mean_ttft_ms / on.mean_ttft_ms:.2f}x")
    if report.mismatches is not None:
        print(f"outputs differing from solo generate(): {report.mismatches}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import aiohttp

    from aioserve.bench.online.serving import AuthenticationError, run_serving
    from aioserve.reports.serving import summarize

    api_key = args.api_key
    if api_key is None:
        api_key = os.environ.get("OPENAI_API_KEY") or os.environ.get("AIOSERVE_API_KEY")
    elif not api_key.strip():
        raise ValueError("--api-key is empty (an unset variable?): give the key, or leave "
                         "the option out")
    check_output(args.plot, "--plot")
    preflight(args, BENCH_SERVE)
    args.base_url = args.base_url.rstrip("/").removesuffix("/v1")  # the OpenAI client's form
    if args.sweep_rate is not None:
        return _serve_sweep(args, api_key or None)
    requests = _requests(args)
    try:
        records, duration, endpoint = asyncio.run(run_serving(
            args.base_url, requests, request_rate=args.request_rate,
            at_arrivals=bool(args.workload), vocab_size=args.vocab_size, endpoint=args.endpoint,
            model=args.served_model_name, seed=args.seed,
            progress=not args.no_progress and not args.json, api_key=api_key or None,
            burstiness=args.burstiness, max_concurrency=args.max_concurrency,
        ))
    except AuthenticationError as exc:
        print(f"aioserve bench serve: authentication failed: {exc}", file=sys.stderr)
        return 1
    except aiohttp.ClientError as exc:
        print(f"aioserve bench serve: cannot reach the server at {args.base_url} "
              f"(--base-url): {exc}", file=sys.stderr)
        return 1
    result = summarize(records, duration, endpoint, slo_ttft_ms=args.slo_ttft_ms,
                       slo_tpot_ms=args.slo_tpot_ms)
    if args.plot:
        from aioserve.bench.online.serving import send_times
        from aioserve.reports.serving_plots import plot_serving, run_title

        source = (Path(args.workload).name if args.workload else "random prompts" + (
            "" if math.isinf(args.request_rate) else ", Poisson arrivals"))
        times = send_times(requests, args.request_rate, args.seed, args.burstiness,
                           bool(args.workload))
        try:
            plot_serving(records, args.plot, run_title(source, times, endpoint))
        except ImportError as exc:
            raise ValueError(f"--plot needs matplotlib: pip install 'aioserve[plots]' "
                             f"({exc})") from None
    print(json.dumps(result.to_dict()) if args.json else result.summary())
    failures = [r.error for r in records if r.error]
    if failures and not args.json:
        print(f"first error: {failures[0]}", file=sys.stderr)
    return 0 if result.completed else 1


def _serve_sweep(args: argparse.Namespace, api_key: str | None) -> int:
    """``bench serve --sweep-rate``: the old spelling of ``aioserve capacity --url``."""
    from aioserve.commands import capacity
    from aioserve.commands.simulate_options import CAPACITY, add_options, old_spelling

    old_spelling("aioserve bench serve --sweep-rate", "aioserve capacity --url")
    if not args.workload:
        raise ValueError("--sweep-rate: give the --workload to sweep (a trace or a named one)")
    if api_key:
        os.environ["AIOSERVE_API_KEY"] = api_key
    defaults = argparse.ArgumentParser()
    add_options(defaults, CAPACITY)
    new = defaults.parse_args([])
    for name in ("workload", "sweep_rate", "sweep_repeats", "target_attainment", "slo_ttft_ms",
                 "slo_tpot_ms", "plot", "json", "max_concurrency"):
        setattr(new, name, getattr(args, name))
    new.url = args.base_url
    return capacity.run(new)


def _overhead(args: argparse.Namespace) -> int:
    from aioserve.bench.overhead import measure_overhead

    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    results = [
        asyncio.run(measure_overhead(args.num_requests, args.num_steps, tokenizer=tokenizer))
        for _ in range(args.runs)
    ]
    best = sorted(results, key=lambda r: r.step_us)[(len(results) - 1) // 2]
    if args.json:
        print(json.dumps({"runs": [r.to_dict() for r in results], "median": best.to_dict()}))
    else:
        for result in results:
            print(result.summary())
        print(f"median: {best.step_us:.1f} us/step")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark; exit status 0 (1: serve completed no request)."""
    return int(args.bench(args))
