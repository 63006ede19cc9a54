"""First-come-first-served continuous batching."""

from __future__ import annotations

from typing import ClassVar

from aioserve.scheduling import RequestView, Scheduler, SchedulerOutput, SchedulerState


class FCFSScheduler(Scheduler):
    """After every step, fill free slots from the queue in arrival order while KV
    blocks allow, stopping at the first request that does not fit. Under memory
    pressure, preempt the newest running requests (recompute later), as vLLM does.

    Args:
        watermark: fraction of all KV blocks kept free at admission, so running
            requests can grow without immediate preemption (vLLM's default, 0.01).
    """

    name: ClassVar[str] = "fcfs"

    def __init__(self, watermark: float = 0.01) -> None:
        self.watermark = watermark

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        free = state.num_free_blocks
        running: list[RequestView] = list(state.running)
        preempt: list[str] = []
        running_tokens, need = state.running_demand()
        while need > free and len(running) > 1:
            victim = running.pop()
            preempt.append(victim.request_id)
            free += len(victim.block_ids)
            need -= state.blocks_needed(victim, state.tokens_to_compute(victim))
        free -= need
        if preempt:
            return SchedulerOutput(preempt=preempt)
        reserve = int(self.watermark * state.num_total_blocks)
        slots = state.max_num_seqs - len(running)
        budget = state.max_num_batched_tokens - running_tokens
        admit: list[str] = []
        for request in state.waiting:
            if slots <= 0 or budget <= 0:
                break
            chunk = min(state.tokens_to_compute(request), budget)
            blocks = state.blocks_needed(request, chunk)
            if free - blocks < reserve and running:
                break
            if blocks > free:
                break
            admit.append(request.request_id)
            free -= blocks
            slots -= 1
            budget -= chunk
        return SchedulerOutput(admit=admit)
