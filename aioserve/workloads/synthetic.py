"""Synthetic bench workloads: random prompts, or groups sharing a prefix (vLLM's datasets)."""

from __future__ import annotations

import random
from collections.abc import Callable

from aioserve.workloads.request import WorkloadRequest


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
    bos_token_id: int | None = 1,
    low_id: int = 3,
) -> list[WorkloadRequest]:
    """Random requests as ``vllm bench throughput --dataset-name random``, from ``seed``."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    rng = random.Random(seed)
    draw = _token_drawer(rng, vocab_size, low_id)
    head = [bos_token_id] if bos_token_id is not None else []
    requests = []
    for index in range(num_prompts):
        length = rng.randint(*input_len)
        requests.append(token_request(index, head + draw(length - len(head)),
                                      rng.randint(*output_len)))
    return requests


def _token_drawer(
    rng: random.Random, vocab_size: int, low_id: int
) -> Callable[[int], list[int]]:
    if vocab_size <= low_id:
        raise ValueError(f"vocab_size must exceed {low_id}, got {vocab_size}")
    return lambda count: [rng.randrange(low_id, vocab_size) for _ in range(count)]


def prefix_repetition_requests(
    num_prompts: int,
    prefix_len: int,
    suffix_len: int,
    num_prefixes: int,
    output_len: tuple[int, int],
    *,
    vocab_size: int,
    seed: int = 0,
    bos_token_id: int | None = 1,
    low_id: int = 3,
) -> list[WorkloadRequest]:
    """Requests in groups sharing a prefix (vLLM's ``prefix_repetition``), from ``seed``."""
    if min(num_prompts, prefix_len, num_prefixes) < 1 or suffix_len < 0:
        raise ValueError("num_prompts, prefix_len and num_prefixes must be >= 1, suffix_len >= 0")
    rng = random.Random(seed)
    draw = _token_drawer(rng, vocab_size, low_id)
    head = [bos_token_id] if bos_token_id is not None else []
    prefixes = [head + draw(prefix_len - len(head)) for _ in range(num_prefixes)]
    requests = [
        token_request(i, prefixes[i % num_prefixes] + draw(suffix_len), rng.randint(*output_len))
        for i in range(num_prompts)
    ]
    rng.shuffle(requests)
    return requests
