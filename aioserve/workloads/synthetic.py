"""Synthetic bench workloads: random prompts, or groups sharing a prefix (vLLM's datasets)."""

from __future__ import annotations

import random
from collections.abc import Callable

from aioserve.workloads.request import FIRST_WORD_ID, WorkloadRequest


def token_request(index: int, prompt: list[int], output_len: int) -> WorkloadRequest:
    """A request of given prompt tokens that generates exactly ``output_len`` (its cap)."""
    return WorkloadRequest(f"b{index}", 0.0, len(prompt), output_len, max_tokens=output_len,
                           prompt_ids=tuple(prompt))


def parse_range(text: str) -> tuple[int, int]:
    """``"LO:HI"`` (inclusive) or ``"N"`` as a pair of positive ints; ValueError otherwise."""
    parts = text.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        raise ValueError(f"expected LO:HI (positive integers), got {text!r}") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"expected LO:HI with 1 <= LO <= HI, got {text!r}")
    return lo, hi


def random_requests(
    num_prompts: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    *,
    vocab_size: int,
    seed: int = 0,
    bos_token_id: int = 1,
) -> list[WorkloadRequest]:
    """Random requests as ``vllm bench throughput --dataset-name random``, from ``seed``."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    rng, draw = _drawer(seed, vocab_size)
    return [token_request(index, [bos_token_id, *draw(rng.randint(*input_len) - 1)],
                          rng.randint(*output_len)) for index in range(num_prompts)]


def _drawer(seed: int, vocab_size: int) -> tuple[random.Random, Callable[[int], list[int]]]:
    """The seeded generator, and a draw of ``count`` word ids from it."""
    if vocab_size <= FIRST_WORD_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_WORD_ID}, got {vocab_size}")
    rng = random.Random(seed)
    return rng, lambda count: [rng.randrange(FIRST_WORD_ID, vocab_size) for _ in range(count)]


def prefix_repetition_requests(
    num_prompts: int,
    prefix_len: int,
    suffix_len: int,
    num_prefixes: int,
    output_len: tuple[int, int],
    *,
    vocab_size: int,
    seed: int = 0,
    bos_token_id: int = 1,
) -> list[WorkloadRequest]:
    """Requests in groups sharing a prefix (vLLM's ``prefix_repetition``), from ``seed``."""
    if min(num_prompts, prefix_len, num_prefixes) < 1 or suffix_len < 0:
        raise ValueError("num_prompts, prefix_len and num_prefixes must be >= 1, suffix_len >= 0")
    rng, draw = _drawer(seed, vocab_size)
    prefixes = [[bos_token_id, *draw(prefix_len - 1)] for _ in range(num_prefixes)]
    requests = [
        token_request(i, prefixes[i % num_prefixes] + draw(suffix_len), rng.randint(*output_len))
        for i in range(num_prompts)
    ]
    rng.shuffle(requests)
    return requests
