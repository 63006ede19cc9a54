"""Shortest-predicted-remaining-first with aging."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, ClassVar

from aioserve.scheduling import OrderedScheduler, PolicyReport, RequestView, SchedulerState
from schedulers.length_predictor import LengthPredictor, PredictorHooks, make_predictor

#: Finished requests whose (predicted, true) lengths a policy keeps for reports.
OUTCOMES_KEPT = 65536


class SPFScheduler(PredictorHooks, OrderedScheduler):
    """Admit the waiting requests with the fewest predicted output tokens left first
    (SRPT on the predicted *remaining* length, as TRAIL; a preempted request is ranked by
    what it has left); otherwise (slots, KV blocks, the watermark, preemption of the
    newest under memory pressure) exactly like ``fcfs``.

    Aging bounds starvation (CASES.md BUG-11): a request that has waited
    ``max_wait_s`` since it arrived goes ahead of every request that has waited less,
    and aged requests keep arrival order. So it starts at the first slot that frees
    after ``max_wait_s`` of waiting, unless an older aged request takes that slot: its
    wait is at most ``max_wait_s`` plus the time until a slot frees. A preempted
    request ages from its original arrival, so newer short jobs cannot push it back
    forever. Requests with equal predictions keep queue order (FCFS).

    Args:
        predictor: the output-length predictor: ``learned`` (default: learns lengths
            online per class, the ``length_hint`` when a client gives one), ``hint``,
            ``cap``, ``oracle`` (true lengths in the simulator: an upper bound), a
            ``"package.module:Class"`` or an object with ``predict(request)``
            (``schedulers/length_predictor.py``).
        predictor_config: the named predictor's parameters, e.g. ``{"state_path":
            "lengths.json"}`` for ``learned``.
        max_wait_s: waiting time in seconds after which a request is served in arrival
            order, ahead of shorter ones (default 30).
        watermark: as ``fcfs``.

    Raises:
        ValueError: max_wait_s negative, a bad predictor, predictor_config or watermark.
    """

    name: ClassVar[str] = "spf"

    def __init__(
        self,
        predictor: LengthPredictor | str | None = None,
        max_wait_s: float = 30.0,
        watermark: float = 0.01,
        predictor_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(watermark)
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}")
        self.predictor = make_predictor(predictor if predictor is not None else "learned",
                                        predictor_config)
        self.max_wait_s = max_wait_s
        self.predicted: dict[str, int] = {}  # at arrival, until it finishes
        self.outcomes: deque[tuple[str, int, int]] = deque(maxlen=OUTCOMES_KEPT)

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        """Tell the predictor; keep its prediction at arrival for the report."""
        super().on_arrival(request, state)
        self.predicted[request.request_id] = self.predictor.predict(request)

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        """Tell the predictor the true length; keep (id, predicted, true)."""
        predicted = self.predicted.pop(request.request_id, None)
        if predicted is not None and request.finish_reason in ("stop", "length"):
            self.outcomes.append((request.request_id, predicted, request.num_output_tokens))
        super().on_finish(request, state)

    def report(self) -> PolicyReport:
        """``predicted_mean``: the mean predicted output (tokens, at arrival) of the
        requests in the engine, ``in_engine`` their number; over the last 100 finished:
        ``prediction_mae`` (mean |predicted - true| tokens) and ``prediction_bias``
        (mean predicted - true)."""
        predicted = list(self.predicted.values())
        recent = list(itertools.islice(reversed(self.outcomes), 100))
        errors = [p - t for _, p, t in recent]
        return {
            "in_engine": float(len(predicted)),
            "predicted_mean": sum(predicted) / len(predicted) if predicted else 0.0,
            "prediction_mae": sum(map(abs, errors)) / len(errors) if errors else 0.0,
            "prediction_bias": sum(errors) / len(errors) if errors else 0.0,
        }

    def key(self, request: RequestView, state: SchedulerState) -> tuple[int, float]:
        """Aged requests first, by arrival; then by predicted remaining output."""
        if state.now - request.arrival_time >= self.max_wait_s:
            return (0, request.arrival_time)
        return (1, self.predictor.remaining(request))
