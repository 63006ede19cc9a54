"""Cost of one sampling step: the vectorised BatchSampler against the per-row Sampler.

R = 256 rows, V = 512 and 49152, all-greedy and all-random; median wall ms, host lists included.

    python3 -m benchmarks.sampler_cost [--device cuda] [--threads N] [--rows R]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from aioserve.runners.torch.batch_sampler import BatchSampler
from aioserve.sampling_params import SamplingParams
from benchmarks.per_row_sampler import Sampler

MODES = {
    "greedy": {"temperature": 0.0},
    "random": {"temperature": 0.8, "top_p": 0.9, "top_k": 50},
}


def median_ms(step: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of ``step()`` over ``repeats`` calls, after one warm-up."""
    step()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(rows: int, vocab: int, mode: str, device: torch.device) -> tuple[float, float]:
    """(old ms, new ms) for one configuration."""
    params = [SamplingParams(seed=i, **MODES[mode]) for i in range(rows)]
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
    logits = logits.to(device)
    old = Sampler(device, seed=0)
    ids = [f"r{i}" for i in range(rows)]
    new = BatchSampler(rows, vocab, device, seed=0)
    for slot, p in enumerate(params):
        new.add(slot, p, [], 0)
    slot_list = list(range(rows))
    slots = torch.tensor(slot_list, device=device)
    repeats = 5 if vocab * rows > 1_000_000 and device.type == "cpu" else 20
    old_ms = median_ms(
        lambda: old.sample(logits.clone(), ids, params, [None] * rows), device, repeats
    )
    new_ms = median_ms(
        lambda: new.sample(logits.clone(), slots, slot_list).to_host(), device, repeats
    )
    return old_ms, new_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--rows", type=int, default=256)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device={device} threads={torch.get_num_threads()} rows={args.rows}")
    print(f"{'vocab':>6} {'mode':>7} {'old ms':>10} {'new ms':>10} {'speed-up':>9}")
    for vocab in (512, 49152):
        for mode in MODES:
            old_ms, new_ms = measure(args.rows, vocab, mode, device)
            print(f"{vocab:>6} {mode:>7} {old_ms:>10.2f} {new_ms:>10.2f} {old_ms / new_ms:>8.1f}x")


if __name__ == "__main__":
    main()
