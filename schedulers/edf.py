"""Earliest deadline first, goodput-aware: requests that can still meet their
service-level objective go first; those that cannot wait, or are shed."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import ClassVar

from aioserve.scheduling import OrderedScheduler, RequestView, SchedulerOutput, SchedulerState


def due(request: RequestView) -> float:
    """The time (engine clock, seconds) by which the request's next objective falls:
    its first token by ``arrival + ttft_slo_ms`` while it has none; after that, its
    tokens so far by ``first token + tpot_slo_ms`` each; else its ``deadline``; else
    never (``inf``)."""
    first = request.first_token_time
    if first is None and request.ttft_slo_ms is not None:
        return request.arrival_time + request.ttft_slo_ms / 1e3
    if first is not None and request.tpot_slo_ms is not None:
        return first + request.tpot_slo_ms / 1e3 * max(request.num_output_tokens - 1, 0)
    return request.deadline if request.deadline is not None else math.inf


class EDFScheduler(OrderedScheduler):
    """Admit by earliest :func:`due` time (Liu and Layland's EDF), ties by arrival;
    requests without objectives come after every request with one, in arrival order.

    Under overload plain EDF serves requests that will miss anyway and makes the next
    ones miss too (the domino effect); goodput (DistServe, vLLM's serving benchmark:
    requests that meet their objectives, per second) is what counts. So a waiting
    request whose due time has already passed is late: it goes after every request that
    can still be on time, and with ``shed_late`` it is shed with a reason (HTTP 503
    ``request_shed``) instead of taking a slot. Under memory pressure the victim is the
    request due last (late ones first).

    Args:
        shed_late: shed late waiting requests instead of serving them last (admission
            control; default False).
        watermark: fraction of KV blocks kept free at admission (as ``fcfs``).

    Raises:
        ValueError: a bad watermark.
    """

    name: ClassVar[str] = "edf"

    def __init__(self, shed_late: bool = False, watermark: float = 0.01) -> None:
        super().__init__(watermark)
        self.shed_late = shed_late

    def key(self, request: RequestView, state: SchedulerState) -> tuple[bool, float, float]:
        deadline = due(request)
        return (deadline < state.now, deadline, request.arrival_time)

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        return sorted(reversed(state.running), key=lambda r: self.key(r, state), reverse=True)

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        decision = super().schedule(state)
        if not self.shed_late or decision.preempt:
            return decision
        admitted = set(decision.admit)
        late = {r.request_id: f"cannot meet its objective: due {state.now - due(r):.3f} s ago"
                for r in state.waiting if r.request_id not in admitted and due(r) < state.now}
        return SchedulerOutput(admit=decision.admit, shed=late) if late else decision
