"""Skip-join multi-level feedback queue (FastServe: Wu et al., "Fast Distributed
Inference Serving for Large Language Models", 2023)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from aioserve.scheduling import (
    OrderedScheduler,
    RequestView,
    SchedulerOutput,
    SchedulerState,
    StepFeedback,
)


class MLFQScheduler(OrderedScheduler):
    """Levels 0 .. ``levels - 1``; level i's quantum is ``quantum * 2**i`` output tokens.
    A request joins the level whose quantum first covers its prompt (skip-join: a long
    prompt does not enter the top queue) and drops a level each time its service at
    its level reaches the level's quantum, so long requests sink and short ones finish
    at the top, without knowing any length beforehand.

    Token-level preemption with the KV kept: with ``batch_size`` below the engine's
    slots, each step runs only the best ``batch_size`` running requests by (level,
    arrival) and pauses the others (slot and KV blocks kept, as FastServe keeps its job
    pool in memory: serve with ``--max-num-seqs`` above ``batch_size``). With ``evict``,
    a waiting request of a better level than the worst running one also preempts it
    when no slot is free (recomputed later: costly where FastServe swaps). Starvation: a
    request not served for ``promote_after_s`` goes back to level 0 (FastServe's
    periodic promotion).

    Args:
        levels: number of queues (>= 1; default 5).
        quantum: output tokens of level 0's quantum (>= 1; default 8).
        batch_size: most requests computed per step (None: all running ones).
        evict: preempt a worse-level running request for a better-level waiting one
            when no slot is free (default False).
        promote_after_s: seconds without service after which a request returns to
            level 0 (default 5).
        watermark: fraction of KV blocks kept free at admission (as ``fcfs``).

    Raises:
        ValueError: levels, quantum or batch_size below 1, a negative promotion time.
    """

    name: ClassVar[str] = "mlfq"

    def __init__(self, levels: int = 5, quantum: int = 8, batch_size: int | None = None,
                 evict: bool = False, promote_after_s: float = 5.0,
                 watermark: float = 0.01) -> None:
        super().__init__(watermark)
        if levels < 1 or quantum < 1 or (batch_size is not None and batch_size < 1):
            raise ValueError("levels, quantum and batch_size must be >= 1")
        if not promote_after_s >= 0:
            raise ValueError(f"promote_after_s must be >= 0, got {promote_after_s!r}")
        self.levels, self.quantum, self.batch_size = levels, quantum, batch_size
        self.evict, self.promote_after_s = evict, promote_after_s
        self.level: dict[str, int] = {}
        self.served: dict[str, int] = {}  # output tokens at its current level
        self.last_served: dict[str, float] = {}

    def on_arrival(self, request: RequestView) -> None:
        level = 0
        while level < self.levels - 1 and self.quantum << level < request.num_prompt_tokens:
            level += 1
        self.level[request.request_id] = level
        self.served[request.request_id] = 0
        self.last_served[request.request_id] = request.arrival_time

    def on_finish(self, request: RequestView) -> None:
        for table in (self.level, self.served, self.last_served):
            table.pop(request.request_id, None)

    def on_step(self, feedback: StepFeedback) -> None:
        for request_id, emitted in zip(feedback.request_ids, feedback.num_emitted_tokens):
            if request_id not in self.level:
                continue
            self.last_served[request_id] = feedback.end_time
            self.served[request_id] += emitted
            level = self.level[request_id]
            if level < self.levels - 1 and self.served[request_id] >= self.quantum << level:
                self.level[request_id], self.served[request_id] = level + 1, 0

    def key(self, request: RequestView, state: SchedulerState) -> tuple[int, float]:
        return (self.level.get(request.request_id, 0), request.arrival_time)

    def promote(self, state: SchedulerState) -> None:
        """Requests not served for ``promote_after_s`` go back to level 0."""
        for request_id, last in self.last_served.items():
            if state.now - last >= self.promote_after_s:
                self.level[request_id], self.served[request_id] = 0, 0
                self.last_served[request_id] = state.now

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        return sorted(reversed(state.running), key=lambda r: self.key(r, state), reverse=True)

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        self.promote(state)
        decision = super().schedule(state)
        if decision.preempt:
            return decision
        running = sorted(state.running, key=lambda r: self.key(r, state))
        preempt: list[str] = []
        waiting = self.order(state)
        full = len(running) >= state.max_num_seqs
        if self.evict and waiting and not decision.admit and full:
            head, worst = waiting[0], running[-1]
            if self.key(head, state) < self.key(worst, state):
                preempt.append(worst.request_id)  # its slot goes to the better level next step
                running.pop()
        pause: list[str] = []
        if self.batch_size is not None:
            pause = [r.request_id for r in running[self.batch_size:]]
        return SchedulerOutput(admit=decision.admit, preempt=preempt, pause=pause)
