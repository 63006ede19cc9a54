"""Which attention backend is faster for a decode batch on this device? ReferenceBackend vs
FlexBackend: time of one layer's ``attend()``.

Per (batch, context): a paged GQA cache (16/8 heads, width 128, random blocks), metadata built
once, median ms per call and the ratio reference / flex. On the CPU flex runs unfused over the
whole cache, so large configurations are skipped (``--max-unfused-gib``, ``--max-cache-gib``);
CPU figures say nothing about the GPU.

Usage (from the repository root): ``python3 -m benchmarks.kernels.attention_backends
[--device cuda]``"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch

from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.registry import backend_for

GIB = 1 << 30
Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16


def timed(fn: Callable[[], torch.Tensor], device: torch.device, warmup: int, runs: int) -> float:
    """Median milliseconds of ``fn`` over ``runs`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def cache_too_big(batch: int, context: int, dtype: torch.dtype,
                  args: argparse.Namespace) -> str | None:
    """Why a configuration's cache exceeds the budget (None: it fits)."""
    element = torch.tensor([], dtype=dtype).element_size()
    cache = 2 * batch * context * KV_HEADS * HEAD_DIM * element
    if cache > args.max_cache_gib * GIB:
        return f"cache {cache / GIB:.1f} GiB > --max-cache-gib {args.max_cache_gib}"
    return None


def unfused_too_big(batch: int, context: int, device: torch.device,
                    args: argparse.Namespace) -> str | None:
    """Why flex's unfused expansion of K and V over the whole cache exceeds the budget, or None."""
    expanded = 2 * batch * Q_HEADS * (batch * context + BLOCK_SIZE) * HEAD_DIM * 4
    if device.type != "cuda" and expanded > args.max_unfused_gib * GIB:
        return f"unfused flex would expand K/V to {expanded / GIB:.1f} GiB"
    return None


@torch.inference_mode()
def run_config(batch: int, context: int, dtype: torch.dtype, device: torch.device,
               args: argparse.Namespace, skip_flex: bool) -> tuple[float | None, float | None]:
    """(reference ms, flex ms or None when skipped) of one decode layer."""
    num_blocks = batch * context // BLOCK_SIZE + 1
    gen = torch.Generator().manual_seed(0)
    shape = (num_blocks * BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(device, dtype)
    v_cache = torch.randn(shape, generator=gen).to(device, dtype)
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    per_seq = context // BLOCK_SIZE
    tables = [order[i * per_seq:(i + 1) * per_seq] for i in range(batch)]
    q = torch.randn(batch, Q_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    rules = LayerRules(Q_HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM, None, None, None, False)
    figures: list[float | None] = []
    for name in ("reference", "flex"):
        if name == "flex" and skip_flex:
            figures.append(None)
            continue
        backend = backend_for(name, device)
        k, v = k_cache, v_cache
        if name == "reference" and device.type == "cpu":  # the runner's head-major layout
            k, v = (c.transpose(0, 1).contiguous().transpose(0, 1) for c in (k_cache, v_cache))
        meta, _ = backend.build_metadata([(k, v)], [context - 1] * batch,
                                         [1] * batch, tables, BLOCK_SIZE, device, ())
        figures.append(timed(lambda b=backend, m=meta, k=k, v=v: b.attend(q, k, v, m, rules,
                                                                          None),
                             device, args.warmup, args.runs))
    return figures[0], figures[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto")
    parser.add_argument("--dtype", default="auto", help="bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=None, help="timed runs (20 CUDA, 3 CPU)")
    parser.add_argument("--max-cache-gib", type=float, default=None,
                        help="skip bigger caches (default: 40 on CUDA, 2 on CPU)")
    parser.add_argument("--max-unfused-gib", type=float, default=1.0,
                        help="off CUDA: skip flex when its unfused K/V expansion is bigger")
    args = parser.parse_args(argv)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    cuda = device.type == "cuda"
    dtype = {"auto": torch.bfloat16 if cuda else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    args.runs = args.runs or (20 if cuda else 3)
    args.max_cache_gib = args.max_cache_gib or (40.0 if cuda else 2.0)
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    print(f"decode attend(), {Q_HEADS}/{KV_HEADS} heads x {HEAD_DIM}, block {BLOCK_SIZE}, "
          f"{dtype}, {device}{' (flex unfused)' if not cuda else ' (flex compiled)'}")
    print(f"{'B':>5} {'context':>8} {'reference ms':>13} {'flex ms':>9} {'ref/flex':>9}")
    for batch in args.batches:
        for context in args.contexts:
            reason = cache_too_big(batch, context, dtype, args)
            if reason is not None:
                print(f"{batch:>5} {context:>8}  skipped: {reason}")
                continue
            unfused = unfused_too_big(batch, context, device, args)
            reference, flex = run_config(batch, context, dtype, device, args, unfused is not None)
            if flex is None:
                print(f"{batch:>5} {context:>8} {reference:>13.3f}  flex skipped: {unfused}")
            else:
                print(f"{batch:>5} {context:>8} {reference:>13.3f} {flex:>9.3f} "
                      f"{reference / flex:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
