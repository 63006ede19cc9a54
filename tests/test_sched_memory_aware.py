"""memory_aware: admission by projected KV use, victims cheapest to recompute."""

from __future__ import annotations

import pytest

from aioserve.request import Request, RequestStatus
from aioserve.sampling_params import SamplingParams
from aioserve.scheduling import SchedulerState
from schedulers.memory_aware import MemoryAwareScheduler


def running(request_id: str, prompt: int, output: int, first_block: int) -> Request:
    """A decoding request whose blocks (size 4) are exactly full."""
    request = Request(request_id, [5] * prompt, SamplingParams(max_tokens=64), 0.0)
    request.output_token_ids = [6] * output
    request.num_computed_tokens = prompt + output - 1
    request.status = RequestStatus.RUNNING
    request.block_ids = list(range(first_block, first_block + request.num_computed_tokens // 4))
    return request


def state(waiting, run, free: int, total: int = 16) -> SchedulerState:
    return SchedulerState(tuple(waiting), tuple(run), free, total, 4, 8, 4096, 0.0, 0)


def test_victim_is_the_cheapest_to_recompute():
    old_big = running("old-big", 8, 9, 0)  # 16 computed tokens, 4 blocks
    mid = running("mid", 4, 9, 4)  # 12 computed, 3 blocks
    new_big = running("new-big", 12, 5, 7)  # 16 computed, 4 blocks
    decision = MemoryAwareScheduler().schedule(state([], [old_big, mid, new_big], free=0))
    # all three need a block; evicting "mid" (12 tokens) frees 3, enough for the other two
    assert list(decision.preempt) == ["mid"] and not decision.admit


def test_admission_by_projected_use_under_the_watermark():
    busy = running("busy", 8, 1, 0)  # no hint: projected to its max_tokens
    small = Request("small", [5] * 4, SamplingParams(max_tokens=8), 0.0)
    big = Request("big", [5] * 4, SamplingParams(max_tokens=60), 0.0)
    policy = MemoryAwareScheduler(watermark=1.0)
    assert policy.projected_blocks(state([], [], 16), big) == 16
    assert policy.projected_blocks(state([], [], 16), busy) == 18  # 8 + 64 tokens
    # while anything runs, a request whose projection does not fit waits (head of line)
    assert list(policy.schedule(state([big, small], [], free=16)).admit) == ["big"]
    lone = running("lone", 4, 1, 0)
    lone.params = SamplingParams(max_tokens=4, length_hint=2)  # projected 2 blocks
    assert list(policy.schedule(state([big, small], [lone], free=15)).admit) == []
    assert list(policy.schedule(state([small, big], [lone], free=15)).admit) == ["small"]


def test_watermark_is_validated():
    with pytest.raises(ValueError, match="watermark"):
        MemoryAwareScheduler(watermark=0)
