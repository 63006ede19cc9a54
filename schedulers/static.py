"""Static batching: the article's baseline."""

from __future__ import annotations

from typing import ClassVar

from aioserve.scheduling import Scheduler, SchedulerOutput, SchedulerState


class StaticScheduler(Scheduler):
    """Admit a batch of up to ``max_num_seqs`` only when nothing is running; the batch
    runs until its last request finishes. Never preempts."""

    name: ClassVar[str] = "static"

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        if state.running:
            return SchedulerOutput()
        batch = state.waiting[: state.max_num_seqs]
        return SchedulerOutput(admit=[r.request_id for r in batch])
