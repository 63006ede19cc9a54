"""First-come-first-served continuous batching."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from aioserve.scheduling import OrderedScheduler, RequestView, SchedulerState


class FCFSScheduler(OrderedScheduler):
    """After every step, fill free slots from the queue in arrival order while KV blocks
    allow (keeping ``watermark`` of them free), stopping at the first request that does not
    fit. Under memory pressure, preempt the newest running requests (recompute later), as
    vLLM does."""

    name: ClassVar[str] = "fcfs"

    def order(self, state: SchedulerState) -> Sequence[RequestView]:
        return state.waiting  # the queue's own order: no sort
