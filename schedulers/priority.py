"""Priority scheduling with preemption and aging (vLLM's ``priority`` policy)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from aioserve.scheduling import OrderedScheduler, RequestView, SchedulerOutput, SchedulerState


def rank(request: RequestView) -> tuple[int, float]:
    """vLLM's order: lower ``priority`` first, then earlier arrival."""
    return (request.priority, request.arrival_time)


class PriorityScheduler(OrderedScheduler):
    """Serve lower ``priority`` values first (vLLM's semantics: the request field
    ``priority``, default 0, ties by arrival), preempting lower-priority work for it.

    * Admission: waiting requests by (priority, arrival), while slots, the token budget
      and KV blocks allow.
    * Preemption for a waiting request: when the first waiting request does not fit
      (no slot, or too few blocks), running requests of strictly lower priority (larger
      value) are preempted, lowest first (then latest arrival), until it fits; the
      victims are recomputed later (vllm-project/vllm#40004 asks exactly this at
      ``max_num_seqs``).
    * Under memory pressure the victim is the lowest-priority running request, then the
      latest arrival (vLLM V1's choice), also when the engine asks (``choose_victim``).
    * Aging (vllm-project/vllm#20608): a request that has waited ``max_wait_s`` goes
      ahead of every request that has waited less, in arrival order; so no request
      waits in the queue much longer than ``max_wait_s`` plus the time a slot takes to
      free.

    Args:
        max_wait_s: the aging bound in seconds (default 10; ``inf`` disables aging).
        watermark: fraction of KV blocks kept free at admission (as ``fcfs``).

    Raises:
        ValueError: max_wait_s negative, or a bad watermark.
    """

    name: ClassVar[str] = "priority"

    def __init__(self, max_wait_s: float = 10.0, watermark: float = 0.01) -> None:
        super().__init__(watermark)
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}")
        self.max_wait_s = max_wait_s

    def aged(self, request: RequestView, state: SchedulerState) -> bool:
        """Whether the request has waited its ``max_wait_s`` since arrival."""
        return state.now - request.arrival_time >= self.max_wait_s

    def key(self, request: RequestView, state: SchedulerState) -> tuple[int, int, float]:
        if self.aged(request, state):
            return (0, 0, request.arrival_time)
        return (1, *rank(request))

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        """Lowest priority first, then the latest arrival."""
        return sorted(state.running, key=rank, reverse=True)

    def choose_victim(self, requester: RequestView,
                      candidates: Sequence[RequestView]) -> str | None:
        return max(candidates, key=rank).request_id

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        preempt = state.preempt_for_growth(self.victims(state))
        if preempt:
            return SchedulerOutput(preempt=preempt)
        reserve = int(self.watermark * state.num_total_blocks)
        order = self.order(state)
        admission = state.admission()
        admitted = admission.fill(order, reserve)
        if len(admitted) == len(order):
            return SchedulerOutput(admit=admitted)
        head = order[len(admitted)]  # the first that did not fit
        victims = [r for r in self.victims(state) if r.priority > head.priority]
        chosen: list[str] = []
        for victim in victims:
            if admission.fits(head, reserve):
                break
            chosen.append(victim.request_id)
            admission.release(victim)
        if not chosen or not admission.fits(head, reserve):
            return SchedulerOutput(admit=admitted)
        admission.admit(head)
        return SchedulerOutput(admit=admission.admitted, preempt=chosen)
