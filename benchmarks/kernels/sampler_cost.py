"""What does one sampling step cost on this device, and how much does the vectorised
BatchSampler save over sampling row by row?

R = 256 rows, V = 512 and 49152, all-greedy and all-random; median wall ms, host lists included.
The row-by-row baseline is the sampler the engine used before BatchSampler (94cae55), kept here
with the paths this benchmark runs (no penalties, no logprobs).

    python3 -m benchmarks.kernels.sampler_cost [--device cuda] [--threads N] [--rows R]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from aioserve.runners.torch.batch_sampler import BatchSampler
from aioserve.sampling_params import SamplingParams


def filter_top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """A copy of ``row`` with logits outside top-k and top-p at -inf."""
    if top_k > 0 and top_k < row.numel():
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop = mass_before >= top_p
        drop[0] = False
        row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return row


class Sampler:
    """The baseline: one token per row, a ``torch.Generator`` per seeded request, the
    exponential race."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self._shared = torch.Generator(device=device).manual_seed(seed)
        self._seeded: dict[str, torch.Generator] = {}

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._shared
        gen = self._seeded.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
            self._seeded[request_id] = gen
        return gen

    def sample(self, logits: torch.Tensor, request_ids: list[str],
               params: list[SamplingParams]) -> list[int]:
        """Token ids of ``logits`` ``[rows, vocab]``."""
        chosen = logits.argmax(dim=-1)
        for i, p in enumerate(params):
            if not p.greedy:
                chosen[i] = self._sample_row(logits[i], request_ids[i], p)
        token_ids: list[int] = chosen.tolist()
        return token_ids

    def _sample_row(self, row: torch.Tensor, request_id: str, params: SamplingParams) -> int:
        row = filter_top_k_top_p(row / params.temperature, params.top_k, params.top_p)
        probs = torch.softmax(row, dim=-1)
        race = torch.empty_like(probs).exponential_(generator=self._generator(request_id, params))
        return int(torch.argmax(probs / race))


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
        lambda: old.sample(logits.clone(), ids, params), device, repeats
    )
    new_ms = median_ms(
        lambda: new.sample(logits.clone(), slots, slot_list).to_host(), device, repeats
    )
    return old_ms, new_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
