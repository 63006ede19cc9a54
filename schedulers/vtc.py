"""Virtual Token Counter fairness across tenants (Sheng et al., OSDI 2024)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import ClassVar

from aioserve.scheduling import (
    Admission,
    OrderedScheduler,
    PolicyReport,
    RequestView,
    SchedulerOutput,
    SchedulerState,
    StepFeedback,
)


def tenant_key(tenant: str | None) -> str:
    """A tenant as a report's key ("" for requests without one)."""
    return tenant if tenant is not None else ""


class VTCScheduler(OrderedScheduler):
    """Serve the backlogged tenant that has received the least weighted service.

    Each tenant (``RequestView.tenant``: the OpenAI ``user`` field or ``X-Tenant``;
    requests without one share the tenant None) has a counter of the service it
    received divided by its weight (the artifact's weighted VTC): ``prompt_weight`` per
    prompt token when a request is first admitted, plus ``output_weight`` per output
    token emitted (``on_step``). The prompt is charged at admission, in ``schedule``,
    because step feedback arrives a step late. Admission repeatedly takes the oldest
    waiting request of the waiting tenant with the smallest counter, while it fits.

    The counter lift (Algorithm 2, lines 4-9; the artifact's ``vtc_req_queue.py``
    ``append`` has only the second case): when a request arrives for a tenant with no
    other request in the engine's waiting queue (requests queued and not admitted,
    including preempted ones back in the queue; running requests do not count), the
    tenant's counter is lifted to the smallest counter of the tenants that have waiting
    requests or, when the queue is empty, to the counter of the tenant whose request
    last left the queue (was admitted). So neither idling nor
    running one long request banks credit, and the service difference between two
    backlogged tenants stays within the paper's bound (Theorem 4.4:
    ``2 * max(prompt_weight * L_input, output_weight * M)``, with M the tokens the KV
    cache holds, divided by the smallest weight here).

    Differences from the paper: recomputation after a preemption is not charged (the
    prompt is charged once, at the first admission: the waste is the scheduler's, not
    the tenant's); the prompt is charged in full even where the prefix cache serves
    part of it (as the artifact's ``input_len``); a preempted request going back to the
    queue lifts nothing (it is not an arrival). Under memory pressure the victim is the
    newest request of the most-served tenant. With ``preempt`` (an addition; the paper
    never preempts), the least-served waiting tenant does not wait for a slot while a
    more-served tenant holds at least two slots more: the newest request of the
    most-served one is preempted for it and recomputed later.

    ``preempt`` defaults to True, as the floors decide: without it a light tenant waits
    for the next slot a heavy one frees, with it the next step (its cost in preemptions
    and recomputed tokens: docs/schedulers.md).

    What VTC bounds is the dispatch delay (Theorem 4.11: a light request is admitted
    within 2(n-1)U/a, a the least service rate) and the service gap, with isolation from
    the heavy tenant's load; not a latency ratio to running alone: a light request
    arriving while its counter is above the heavy one's waits until that counter catches
    up (tests/test_sched_vtc_floors.py; figures in docs/policies.md).

    Args:
        prompt_weight: service per prompt token (the paper's w_p, default 1).
        output_weight: service per output token (the paper's w_q, default 2).
        weights: tenant -> weight (> 0); a tenant's counter grows by its service
            divided by its weight, so a tenant of weight 3 gets 3x the service of one
            of weight 1 while both are backlogged. Unlisted tenants weigh 1.
        preempt: preempt for the least-served waiting tenant (default True).

    Raises:
        ValueError: a service weight < 0, a tenant weight <= 0 (named), or a bad watermark.
    """

    name: ClassVar[str] = "vtc"
    #: report() entries keyed by tenant (labelled by /metrics' tenant rule)
    report_tenant_keys: ClassVar[frozenset[str]] = frozenset({"counters", "weights"})

    def __init__(self, prompt_weight: float = 1.0, output_weight: float = 2.0,
                 weights: Mapping[str, float] | None = None, preempt: bool = True,
                 watermark: float = 0.01) -> None:
        super().__init__(watermark)
        for name, value in (("prompt_weight", prompt_weight), ("output_weight", output_weight)):
            if not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be >= 0 and finite, got {value!r}")
        for tenant, weight in (weights or {}).items():
            if not 0 < weight < float("inf"):
                raise ValueError(f"weights[{tenant!r}] must be > 0 and finite, got {weight!r}")
        self.prompt_weight = prompt_weight
        self.output_weight = output_weight
        self.weights: dict[str | None, float] = {t: w for t, w in (weights or {}).items()}
        self.preempt = preempt
        self.counters: dict[str | None, float] = {}
        self.tenant_of: dict[str, str | None] = {}  # requests not finished
        self.charged: set[str] = set()  # requests whose prompt is counted
        self.ended: list[str] = []  # finished since the last step's feedback
        self.departed: list[str | None] = []  # the tenant whose request last left the queue

    def weight(self, tenant: str | None) -> float:
        """The tenant's weight (1 unless ``weights`` names it)."""
        return self.weights.get(tenant, 1.0)

    def counter(self, tenant: str | None) -> float:
        """The tenant's weighted service so far (0 for a new tenant)."""
        return self.counters.get(tenant, 0.0)

    def charge(self, tenant: str | None, service: float) -> None:
        """Add ``service`` (weighted tokens) to the tenant's counter, over its weight."""
        self.counters[tenant] = self.counter(tenant) + service / self.weight(tenant)

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        tenant = request.tenant
        self.tenant_of[request.request_id] = tenant
        others = {r.tenant for r in state.waiting if r.request_id != request.request_id}
        if tenant in others:
            return
        backlogged = [self.counter(t) for t in others]
        if backlogged:  # the counter lift
            self.counters[tenant] = max(self.counter(tenant), min(backlogged))
        elif self.departed:  # into an empty queue: the last-departed tenant's counter
            self.counters[tenant] = max(self.counter(tenant), self.counter(self.departed[0]))

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        # forgotten after the step's feedback, which still counts its last token
        self.ended.append(request.request_id)

    def on_step(self, feedback: StepFeedback, state: SchedulerState) -> None:
        for request_id, emitted in zip(feedback.request_ids, feedback.num_emitted_tokens):
            if emitted and request_id in self.tenant_of:
                self.charge(self.tenant_of[request_id], self.output_weight * emitted)
        for request_id in self.ended:
            self.tenant_of.pop(request_id, None)
            self.charged.discard(request_id)
        self.ended.clear()

    def report(self) -> PolicyReport:
        """``counters``: each tenant's weighted service (tokens over its weight);
        ``weights``: each tenant's weight (named ones, and 1 for each tenant seen);
        ``service_gap``: the largest counter less the smallest. Keys: tenants ("" for
        requests without one)."""
        counters = {tenant_key(t): c for t, c in self.counters.items()}
        weights = {tenant_key(t): self.weight(t)
                   for t in {*self.weights, *self.counters}}
        gap = max(counters.values()) - min(counters.values()) if counters else 0.0
        return {"counters": counters, "weights": weights, "service_gap": gap}

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        """The most-served tenant's requests first, newest first."""
        newest_first = list(reversed(state.running))
        return sorted(newest_first, key=lambda r: -self.counter(r.tenant))

    def _admit(self, admission: Admission, request: RequestView) -> None:
        """Admit the request and charge its prompt, once in its life."""
        admission.admit(request)
        self.departed[:] = [request.tenant]
        if request.request_id not in self.charged:
            self.charged.add(request.request_id)
            self.charge(request.tenant, self.prompt_weight * request.num_prompt_tokens)

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
            tenant = min(queues, key=self.counter)
            request = queues[tenant][-1]
            if not admission.fits(request, reserve):
                break
            self._admit(admission, request)
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
        tenant = min(queues, key=self.counter)
        request = queues[tenant][-1]
        load = Counter(r.tenant for r in state.running)
        victims = [r for r in self.victims(state) if load[r.tenant] > load[tenant] + 1
                   and self.counter(r.tenant) >= self.counter(tenant)]
        if not victims:
            return SchedulerOutput(admit=admission.admitted)
        admission.release(victims[0])
        if not admission.fits(request, reserve):
            return SchedulerOutput(admit=admission.admitted)
        self._admit(admission, request)
        return SchedulerOutput(admit=admission.admitted, preempt=[victims[0].request_id])
