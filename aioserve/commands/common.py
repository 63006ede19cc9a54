"""Options shared by the commands that load a model."""

from __future__ import annotations

import argparse
import json
import logging
from typing import TYPE_CHECKING, Any

from aioserve.config import EngineConfig
from aioserve.memory_size import parse_memory
from aioserve.runners.attention import registry as attention_registry
from aioserve.scheduling.registry import load_scheduler, params_by_policy

if TYPE_CHECKING:
    #: What ``ArgumentParser.add_subparsers`` returns; each command's ``add_parser`` takes it.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Add --model, --scheduler, --max-num-seqs and the cache options."""
    parser.add_argument("--model", required=True, help="model directory or hub id")
    parser.add_argument("--tokenizer", default=None, help="tokenizer (default: the model's)")
    add_scheduler_options(parser)
    parser.add_argument("--max-num-seqs", type=int, default=32,
                        help="slots: most requests running at once")
    parser.add_argument("--max-num-batched-tokens", type=int, default=4096,
                        help="most tokens (prefill + decode) in one step; longer prompts are "
                             "prefilled in chunks")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--num-kv-blocks", type=int, default=None,
                        help="KV cache size in blocks (overrides --kv-cache-memory)")
    parser.add_argument("--kv-cache-memory", default="4GiB", metavar="SIZE",
                        help="KV cache budget: a size (2GiB, 512MiB) or a fraction of free "
                        "memory (0.9 or 90%%; GPU: free device memory). Default 4GiB; never "
                        "more blocks than max-num-seqs x max-model-len need")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context length in tokens, at most the model's "
                             "(default: the model's max_position_embeddings)")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="weights and KV cache dtype (auto: float32 on CPU, bfloat16 on CUDA)",
    )
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when present), cpu or cuda[:N]")
    parser.add_argument("--seed", type=int, default=0, help="seed for requests without one")
    add_prefix_caching_option(parser)
    add_runner_options(parser)


def add_scheduler_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--scheduler`` and ``--scheduler-config``."""
    parser.add_argument("--scheduler", default="fcfs",
                        help="policy name (fcfs, static, spf, memory_aware, priority, vtc, edf, "
                             "mlfq, or an entry point) or package.module:Class")
    parser.add_argument("--scheduler-config", default=None, metavar="JSON",
                        help="the policy's parameters as a JSON object, e.g. "
                             "'{\"max_wait_s\": 5}' (see docs/schedulers.md)")


def scheduler_params(text: str | None) -> dict[str, Any] | None:
    """The ``--scheduler-config`` JSON object, or None.

    Raises:
        ValueError: not a JSON object (the message names the option).
    """
    if text is None:
        return None
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--scheduler-config: not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        raise ValueError("--scheduler-config: must be a JSON object of parameters, e.g. "
                         "'{\"max_wait_s\": 5}'")
    return params


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--forward`` and ``--attention-backend`` (how the runner runs the model)."""
    parser.add_argument(
        "--forward", default="auto", choices=["auto", *attention_registry.FORWARDS],
        help="the model's forward: auto (the lean forward where it applies and its logits "
             "equal transformers' bit for bit at load, else transformers'), the model's "
             "own (any decoder), or the lean forward of Llama checkpoints (fewer Python "
             "calls; on the CPU; checked bit for bit against transformers' at load)",
    )
    parser.add_argument(
        "--attention-backend", default="reference",
        choices=list(attention_registry.backend_names()),
        help="attention implementation behind the runner's seam: reference (exact, any "
             "device) or flex (FlexAttention over the paged cache; compiled, with CUDA "
             "graphs for decode steps, on CUDA)",
    )
    parser.add_argument("--enforce-eager", action="store_true",
                        help="never capture CUDA graphs (vLLM's flag of the same name)")
    parser.add_argument(
        "--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
        help="a request's greedy tokens in any batch equal its tokens alone (row padding "
             "and a 32-key context floor on the CPU); --no-batch-invariant saves that time",
    )


def add_prefix_caching_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--enable-prefix-caching`` / ``--no-enable-prefix-caching`` (default on)."""
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
        help="reuse the KV blocks of prompt prefixes already computed (default: on)",
    )


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed engine options.

    Raises:
        ValueError: an option is out of range (the message names it).
    """
    try:
        budget = parse_memory(args.kv_cache_memory)
    except ValueError as exc:
        raise ValueError(f"--kv-cache-memory: {exc}") from None
    params = scheduler_params(args.scheduler_config)
    try:  # refuse a bad policy or parameter now, before the model loads
        params = params_by_policy([args.scheduler], params)[args.scheduler]
        load_scheduler(args.scheduler, params)
    except ValueError as exc:
        raise ValueError(f"--scheduler/--scheduler-config: {exc}") from None
    return EngineConfig(
        model=args.model,
        tokenizer=args.tokenizer,
        scheduler=args.scheduler,
        scheduler_config=params,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_bytes=budget.bytes or EngineConfig.kv_cache_memory_bytes,
        kv_cache_memory_fraction=budget.fraction,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
        enable_prefix_caching=args.enable_prefix_caching,
        forward=args.forward,
        attention_backend=args.attention_backend,
        enforce_eager=args.enforce_eager,
        batch_invariant=args.batch_invariant,
    )


def quiet_loading(verbose: bool) -> None:
    """Show transformers' "Loading weights" progress bar and aiohttp's access-log line
    per request only when ``verbose`` (``--log-level debug``): at the default level a
    start prints the summary and a request prints nothing."""
    from transformers.utils import logging as hf_logging

    if verbose:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    logging.getLogger("aiohttp.access").setLevel(logging.NOTSET if verbose else logging.WARNING)
