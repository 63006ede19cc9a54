"""Options shared by the commands that load a model."""

from __future__ import annotations

import argparse

from aioserve.config import EngineConfig
from aioserve.memory_size import parse_memory


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Add --model, --scheduler, --max-num-seqs and the cache options."""
    parser.add_argument("--model", required=True, help="model directory or hub id")
    parser.add_argument("--tokenizer", default=None, help="tokenizer (default: the model's)")
    parser.add_argument("--scheduler", default="fcfs", help="policy name or package.module:Class")
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


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--forward`` and ``--attention-backend`` (how the runner runs the model)."""
    parser.add_argument(
        "--forward", default="auto", choices=["auto", "transformers", "lean-llama"],
        help="the model's forward: auto (the lean forward where it applies and its logits "
             "equal transformers' bit for bit at load, else transformers'), the model's "
             "own (any decoder), or the lean forward of Llama checkpoints (fewer Python "
             "calls; on the CPU; checked bit for bit against transformers' at load)",
    )
    parser.add_argument(
        "--attention-backend", default="reference", choices=["reference", "flex"],
        help="attention implementation behind the runner's seam: reference (exact, any "
             "device) or flex (FlexAttention over the paged cache; compiled, with CUDA "
             "graphs for decode steps, on CUDA)",
    )
    parser.add_argument("--enforce-eager", action="store_true",
                        help="never capture CUDA graphs (vLLM's flag of the same name)")


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
    return EngineConfig(
        model=args.model,
        tokenizer=args.tokenizer,
        scheduler=args.scheduler,
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
    )
