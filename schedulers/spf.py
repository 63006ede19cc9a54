"""Shortest-predicted-first with aging."""

from __future__ import annotations

from typing import ClassVar

from aioserve.scheduling import OrderedScheduler, RequestView, SchedulerState
from schedulers.length_predictor import LengthPredictor, make_predictor, predicted_remaining


class SPFScheduler(OrderedScheduler):
    """Admit the waiting requests with the fewest predicted output tokens left first;
    otherwise (slots, KV blocks, the watermark, preemption of the newest under memory
    pressure) exactly like ``fcfs``.

    Aging bounds starvation (CASES.md BUG-11): a request that has waited
    ``max_wait_s`` since it arrived goes ahead of every request that has waited less,
    and aged requests keep arrival order. So it starts at the first slot that frees
    after ``max_wait_s`` of waiting, unless an older aged request takes that slot: its
    wait is at most ``max_wait_s`` plus the time until a slot frees. A preempted
    request ages from its original arrival, so newer short jobs cannot push it back
    forever. Requests with equal predictions keep queue order (FCFS).

    Args:
        predictor: the output-length predictor: an object with ``predict(request)``,
            or a ``"package.module:Class"`` to make one (default ``HintPredictor``: the
            request's ``length_hint``, else ``max_tokens``).
        max_wait_s: waiting time in seconds after which a request is served in arrival
            order, ahead of shorter ones (default 30).
        watermark: as ``fcfs``.

    Raises:
        ValueError: max_wait_s negative, a bad predictor or watermark.
    """

    name: ClassVar[str] = "spf"

    def __init__(
        self,
        predictor: LengthPredictor | str | None = None,
        max_wait_s: float = 30.0,
        watermark: float = 0.01,
    ) -> None:
        super().__init__(watermark)
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}")
        self.predictor = make_predictor(predictor)
        self.max_wait_s = max_wait_s

    def key(self, request: RequestView, state: SchedulerState) -> tuple[int, float]:
        """Aged requests first, by arrival; then by predicted remaining output."""
        if state.now - request.arrival_time >= self.max_wait_s:
            return (0, request.arrival_time)
        return (1, predicted_remaining(self.predictor, request))
