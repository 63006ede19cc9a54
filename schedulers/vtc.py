"""Virtual Token Counter fairness across tenants (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import ClassVar

from aioserve.scheduling import (
    Admission,
    OrderedScheduler,
    RequestView,
    SchedulerOutput,
    SchedulerState,
    StepFeedback,
)


class VTCScheduler(OrderedScheduler):
    """Serve the tenant that has received the least service so far.

    Each tenant (``RequestView.tenant``: the OpenAI ``user`` field or ``X-Tenant``;
    requests without one share the tenant None) has a counter of the service it
    received: ``prompt_weight`` per input token when a request is admitted (prompt, or
    prompt + output when recomputed after a preemption) plus ``output_weight`` per
    output token each step (``on_step``), the paper's weighted token count. Admission
    repeatedly takes the oldest waiting request of the backlogged tenant with the
    smallest counter, while it fits. A tenant whose queue was empty is lifted to the
    smallest counter of the backlogged tenants when a request of its arrives, so idling
    earns no credit (the paper's counter lift); this bounds the service difference
    between backlogged tenants (the paper's Theorem 4.4). Under memory pressure the
    victim is the newest request of the most-served tenant. With ``preempt`` (default),
    the least-served waiting tenant does not wait for a slot while a more-served tenant
    holds at least two slots more: the newest request of the most-served one is
    preempted for it (recomputed later), so a light tenant's first token does not wait
    for a heavy tenant's long requests to end.

    Args:
        prompt_weight: service per input token (the paper's w_p, default 1).
        output_weight: service per output token (the paper's w_q, default 2).
        preempt: preempt for the least-served tenant (default True).
        watermark: fraction of KV blocks kept free at admission (as ``fcfs``).

    Raises:
        ValueError: a negative weight, or a bad watermark.
    """

    name: ClassVar[str] = "vtc"

    def __init__(self, prompt_weight: float = 1.0, output_weight: float = 2.0,
                 preempt: bool = True, watermark: float = 0.01) -> None:
        super().__init__(watermark)
        if not (prompt_weight >= 0 and output_weight >= 0):
            raise ValueError("prompt_weight and output_weight must be >= 0")
        self.prompt_weight = prompt_weight
        self.output_weight = output_weight
        self.preempt = preempt
        self.counters: defaultdict[str | None, float] = defaultdict(float)
        self.active: Counter[str | None] = Counter()  # requests per tenant, not finished
        self.tenant_of: dict[str, str | None] = {}

    def on_arrival(self, request: RequestView) -> None:
        tenant = request.tenant
        if not self.active[tenant]:
            backlogged = [self.counters[t] for t, n in self.active.items() if n]
            if backlogged:  # the counter lift
                self.counters[tenant] = max(self.counters[tenant], min(backlogged))
        self.active[tenant] += 1
        self.tenant_of[request.request_id] = tenant

    def on_finish(self, request: RequestView) -> None:
        tenant = self.tenant_of.pop(request.request_id, request.tenant)
        self.active[tenant] -= 1
        if self.active[tenant] <= 0:
            del self.active[tenant]

    def on_step(self, feedback: StepFeedback) -> None:
        for request_id, emitted in zip(feedback.request_ids, feedback.num_emitted_tokens):
            if emitted and request_id in self.tenant_of:
                self.counters[self.tenant_of[request_id]] += self.output_weight * emitted

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        """The most-served tenant's requests first, newest first."""
        newest_first = list(reversed(state.running))
        return sorted(newest_first, key=lambda r: -self.counters[r.tenant])

    def choose_victim(self, requester: RequestView,
                      candidates: Sequence[RequestView]) -> str | None:
        return max(candidates, key=lambda r: self.counters[r.tenant]).request_id

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        preempt = state.preempt_for_growth(self.victims(state))
        if preempt:
            return SchedulerOutput(preempt=preempt)
        reserve = int(self.watermark * state.num_total_blocks)
        queues: dict[str | None, list[RequestView]] = {}
        for request in reversed(state.waiting):  # each tenant's oldest last: pop() takes it
            queues.setdefault(request.tenant, []).append(request)
        admission = state.admission()
        while queues:
            tenant = min(queues, key=lambda t: self.counters[t])
            request = queues[tenant][-1]
            if not admission.fits(request, reserve):
                break
            admission.admit(request)
            self.counters[tenant] += self.prompt_weight * state.tokens_to_compute(request)
            queues[tenant].pop()
            if not queues[tenant]:
                del queues[tenant]
        if queues and self.preempt:
            return self._make_room(state, admission, queues, reserve)
        return SchedulerOutput(admit=admission.admitted)

    def _make_room(self, state: SchedulerState, admission: Admission,
                   queues: dict[str | None, list[RequestView]], reserve: int) -> SchedulerOutput:
        """Preempt for the least-served waiting tenant, from a more-served tenant that
        holds at least two more slots."""
        tenant = min(queues, key=lambda t: self.counters[t])
        request = queues[tenant][-1]
        load = Counter(r.tenant for r in state.running)
        victims = [r for r in self.victims(state) if load[r.tenant] > load[tenant] + 1
                   and self.counters[r.tenant] > self.counters[tenant]]
        if not victims:
            return SchedulerOutput(admit=admission.admitted)
        admission.release(victims[0])
        if not admission.fits(request, reserve):
            return SchedulerOutput(admit=admission.admitted)
        admission.admit(request)
        self.counters[tenant] += self.prompt_weight * state.tokens_to_compute(request)
        return SchedulerOutput(admit=admission.admitted, preempt=[victims[0].request_id])
