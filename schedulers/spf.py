"""Shortest-predicted-remaining-first with aging."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

from aioserve.scheduling import (
    OrderedScheduler,
    PolicyReport,
    RequestView,
    SchedulerOutput,
    SchedulerState,
)
from schedulers.length_predictor import LengthPredictor, PredictorHooks, make_predictor

#: Finished requests whose (predicted, true) lengths a policy keeps for reports.
OUTCOMES_KEPT = 65536


class SPFScheduler(PredictorHooks, OrderedScheduler):
    """Admit the waiting requests with the fewest predicted output tokens left first
    (SRPT on the predicted *remaining* length, as TRAIL; a preempted request is ranked by
    what it has left); otherwise (slots, KV blocks, the watermark, preemption of the
    newest under memory pressure) exactly like ``fcfs``.

    Aging bounds starvation (CASES.md BUG-11): a request that has waited
    ``max_wait_s`` since it arrived is aged; aged requests keep arrival order and get
    ``aged_share`` of the admissions made while aged and younger requests both wait (a
    deficit counter, as priority's shares: after k such admissions they have had at
    least ``ceil(aged_share * k)``; and an aged request goes ahead of every younger one
    predicted no shorter). So the oldest aged request starts at the first slot that
    frees after ``max_wait_s`` of waiting, and each later one within ``1 /
    aged_share`` admissions per older aged request ahead of it. A share rather than
    all the admissions keeps the order under overload, where most requests wait past
    ``max_wait_s`` and aged-first would make spf fcfs. A preempted request ages from
    its original arrival, so newer short jobs cannot push it back forever. Requests
    with equal predictions keep queue order (FCFS).

    Args:
        predictor: the output-length predictor: ``learned`` (default: learns lengths
            online per class, the ``length_hint`` when a client gives one), ``hint``,
            ``cap``, ``oracle`` (true lengths in the simulator: an upper bound), a
            ``"package.module:Class"`` or an object with ``predict(request)``
            (``schedulers/length_predictor.py``).
        predictor_config: the named predictor's parameters, e.g. ``{"state_path":
            "lengths.json"}`` for ``learned``.
        max_wait_s: waiting time in seconds after which a request is aged (default 30).
        watermark: as ``fcfs``.
        aged_share: the aged requests' share of the admissions made while aged and
            younger requests both wait (default 0.5; 1: aged requests always first).

    Raises:
        ValueError: max_wait_s negative, aged_share outside (0, 1], a bad predictor,
            predictor_config or watermark.
    """

    name: ClassVar[str] = "spf"

    def __init__(
        self,
        predictor: LengthPredictor | str | None = None,
        max_wait_s: float = 30.0,
        watermark: float = 0.01,
        predictor_config: dict[str, Any] | None = None,
        aged_share: float = 0.5,
    ) -> None:
        super().__init__(watermark)
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}")
        self.predictor = make_predictor(predictor if predictor is not None else "learned",
                                        predictor_config)
        self.max_wait_s = max_wait_s
        if not 0 < aged_share <= 1:
            raise ValueError(f"aged_share must be in (0, 1], got {aged_share!r}")
        self.aged_share = aged_share
        self.contested = self.shared = 0  # admissions while aged and fresh both waited
        self._counts: list[tuple[int, int]] = []  # (contested, shared) along the last order
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

    def order(self, state: SchedulerState) -> Sequence[RequestView]:
        """Aged requests (by arrival) and the others (by predicted remaining output)
        interleaved so the aged get ``aged_share`` of the admissions made while both wait."""
        ranked = super().order(state)
        aged = [r for r in ranked if state.now - r.arrival_time >= self.max_wait_s]
        fresh = list(ranked[len(aged):])
        contested, shared = self.contested, self.shared
        out: list[RequestView] = []
        self._counts = [(contested, shared)]
        while aged and fresh:
            take_aged = (shared < self.aged_share * (contested + 1)
                         or self.predictor.remaining(aged[0])
                         <= self.predictor.remaining(fresh[0]))
            out.append(aged.pop(0) if take_aged else fresh.pop(0))
            contested, shared = contested + 1, shared + take_aged
            self._counts.append((contested, shared))
        return out + aged + fresh

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        self._counts = []
        decision = super().schedule(state)
        if self._counts:  # the admissions are a prefix of the order
            self.contested, self.shared = self._counts[min(len(decision.admit),
                                                           len(self._counts) - 1)]
        return decision
