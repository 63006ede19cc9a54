"""Priority scheduling with a guaranteed share for lower priorities (vLLM's ``priority``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from aioserve.scheduling import (
    Admission,
    OrderedScheduler,
    RequestView,
    SchedulerOutput,
    SchedulerState,
)


def rank(request: RequestView) -> tuple[int, float]:
    """vLLM's order: lower ``priority`` first, then earlier arrival."""
    return (request.priority, request.arrival_time)


class PriorityScheduler(OrderedScheduler):
    """Serve lower ``priority`` values first (vLLM V1's semantics: the request field
    ``priority``, default 0, ties by arrival), preempting lower-priority work for it,
    and give lower priorities a stated share of admissions.

    * Admission: waiting requests by (priority, arrival), while slots, the token budget
      and KV blocks allow; except that of the admissions made while requests of the
      best waiting priority and of lower priorities (larger values) both wait, a
      fraction ``low_share`` goes to the oldest waiting lower-priority request (a
      deficit counter: after k such admissions, the lower priorities have had
      ``floor(low_share * k)``). So under sustained overload the best
      class is served in order and still no class starves: each lower priority gets at
      least its share, which no aging can promise (an aging bound is either shorter
      than the queue, and then aged requests jump it and cancel priority, or longer,
      and then it bounds nothing).
    * Preemption for a waiting request: when the best-priority waiting request does not
      fit (no slot, or too few blocks), running requests of strictly lower priority
      are preempted, lowest first (then latest arrival), until it fits; requests
      admitted under ``low_share`` are exempt until they finish (else the share would
      be preempted away). Victims are recomputed later (vllm-project/vllm#40004).
    * Under memory pressure the victim is the lowest-priority running request, then the
      latest arrival (vLLM V1's choice), before a step and when the engine evicts during one;
      the room it frees goes in the same step to waiting requests of a strictly better
      priority, if any (so a high-priority request does not wait out the lower ones'
      growth).

    Differences from vLLM: vLLM V1 has no starvation guard; its proposed aging
    (vllm-project/vllm#20608) is replaced by ``low_share``, which keeps the order of
    every class and bounds what the lower ones get instead of when they start.

    Args:
        low_share: fraction of admissions, while the best class and lower ones both
            wait, that go to the oldest lower-priority request (default 0.1; 0 is
            strict priority).

    Raises:
        ValueError: low_share outside [0, 1), or a bad watermark.
    """

    name: ClassVar[str] = "priority"

    def __init__(self, low_share: float = 0.1, watermark: float = 0.01) -> None:
        super().__init__(watermark)
        if not 0 <= low_share < 1:
            raise ValueError(f"low_share must be in [0, 1), got {low_share!r}")
        self.low_share = low_share
        self.contested = 0  # admissions while the best class and lower ones both waited
        self.shared = 0  # of those, the lower priorities'
        self.protected: set[str] = set()  # admitted under the share: no priority preemption

    def key(self, request: RequestView, state: SchedulerState) -> tuple[int, float]:
        return rank(request)

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        """Lowest priority first, then the latest arrival."""
        return sorted(state.running, key=rank, reverse=True)

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        self.protected.discard(request.request_id)

    def on_preempt(self, request: RequestView, state: SchedulerState) -> None:
        self.protected.discard(request.request_id)

    def _admissions(self, order: list[RequestView], admission: Admission,
                    reserve: int) -> RequestView | None:
        """Admit from ``order`` with the lower priorities' share; the best-class misfit, or None."""
        while order:
            best = order[0].priority
            lower = next((i for i, r in enumerate(order) if r.priority != best), None)
            index = 0
            if lower is not None:
                self.contested += 1
                if self.shared + 1 <= self.low_share * self.contested:
                    index = min(range(lower, len(order)), key=lambda i: order[i].arrival_time)
            request = order[index]
            if not admission.fits(request, reserve):
                if lower is not None:
                    self.contested -= 1
                return request if index == 0 else None
            admission.admit(request)
            if index:
                self.shared += 1
                self.protected.add(request.request_id)
            del order[index]
        return None

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        reserve = int(self.watermark * state.num_total_blocks)
        admission = state.admission()
        growth = state.preempt_for_growth(self.victims(state))
        if growth:  # the victims' room goes only to requests of a better priority
            running = {r.request_id: r for r in state.running}
            worst = min(running[v].priority for v in growth)
            for victim in growth:
                admission.release(running[victim])
            better = [r for r in self.order(state) if r.priority < worst]
            return SchedulerOutput(admit=admission.fill(better, reserve), preempt=growth)
        head = self._admissions(list(self.order(state)), admission, reserve)
        if head is None:
            return SchedulerOutput(admit=admission.admitted)
        victims = [r for r in self.victims(state) if r.request_id not in self.protected]
        admitted = set(admission.admitted)
        waiting = [r for r in self.order(state) if r.request_id not in admitted]
        chosen: list[str] = []
        for request in waiting:  # preempt for each in order, while lower priorities run
            saved = (admission.slots, admission.budget, admission.free_blocks)
            taken: list[RequestView] = []
            while not admission.fits(request, reserve) and victims \
                    and victims[0].priority > request.priority:
                taken.append(victims.pop(0))
                admission.release(taken[-1])
            if not admission.fits(request, reserve):
                admission.slots, admission.budget, admission.free_blocks = saved
                victims[:0] = taken
                break
            admission.admit(request)
            chosen += [v.request_id for v in taken]
            if any(r.priority > request.priority for r in state.waiting):
                self.contested += 1
        return SchedulerOutput(admit=admission.admitted, preempt=chosen)
