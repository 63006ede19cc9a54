"""Earliest deadline first, goodput-aware: late requests wait longer, or are shed."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from aioserve.scheduling import (
    OrderedScheduler,
    PolicyReport,
    RequestView,
    SchedulerOutput,
    SchedulerState,
    StepFeedback,
)
from schedulers.length_predictor import LengthPredictor, PredictorHooks, make_predictor


class EDFScheduler(PredictorHooks, OrderedScheduler):
    """Admit by earliest due time of the *next* token (Liu and Layland's EDF), ties by
    arrival.

    :meth:`due`: the latest time the request's next token can come and the request still
    meet every objective it carries. Its first token: ``arrival + ttft_slo_ms``; every
    later one: ``last token time + tpot_slo_ms``; and with a ``deadline`` (when the
    request must be *finished*, as in ``RequestMeta`` and the reports), ``deadline - (n -
    1) * margin * step`` where n is its predicted remaining output (the ``predictor``'s,
    spf's ``learned`` by default), ``margin`` is ``deadline_margin`` (1.5: room for a
    request longer than predicted) and ``step`` the recent mean step time (a running
    request gets one token a step). The earliest of those that apply; with none,
    ``arrival + default_ttft_ms`` (first token) or ``last + default_tpot_ms``: a
    best-effort objective, so a request without objectives ages like any other and is
    not starved.

    Under overload plain EDF serves requests that will miss anyway and makes the next
    ones miss too (the domino effect); goodput (DistServe, vLLM's serving benchmark:
    requests that meet their objectives, per second) is what counts. So a waiting
    request that has not streamed and cannot meet its first-token due time any more
    (the slack check: due before now plus one step, the mean of recent steps) is late
    (hopeless, as in attainment-maximising EDF): it waits behind every request that can
    still be on time, including those that arrive later, until it has waited twice the
    hold time since its arrival, then goes back in order of its due time. The hold time
    is the queue's drain time (waiting requests over the finish rate of the last
    seconds: about the wait fcfs would give it), at least ``late_delay_s`` and at most
    6x that. Counting from arrival, not from the missed due time, keeps a late request
    from coming back, by its long-past due time, ahead of requests still on time (the
    deadline-only ones, whose due is far off, lost their slots to them near capacity);
    its wait stays within about twice fcfs's near capacity and bounded under sustained
    overload. Only a request that carries an objective is ever late (the defaults are
    no objective).
    With ``shed_late`` a late request that carries a TTFT objective or a deadline is
    shed with a reason (HTTP 503 ``request_shed``) instead. A request that has streamed
    tokens (one preempted and back in the queue) is never shed and never late: it
    resumes before any request that has not started, by its next token's due time (so
    new requests do not pile preempted streams up under memory pressure). Under memory
    pressure the victims are requests without a TPOT objective or deadline first (newest
    first), then those with one, by most slack (:meth:`slack`).

    Differences from the literature: EDF orders by one deadline per job; here each
    token has one (TTFT, then TPOT per token, and the deadline pulled forward by
    ``deadline_margin`` times the predicted work left, since that work is a prediction),
    and late jobs are delayed, not dropped, unless ``shed_late``.

    Args:
        shed_late: shed late waiting requests with an objective instead of serving them
            later (admission control; default False).
        default_ttft_ms: first-token objective of a request without one (default 10 s).
        default_tpot_ms: per-token objective of a request without one (default 200).
        late_delay_s: the least hold time (default 5 s; up to 6x that while the queue
            drains slower): a late request is held behind the ones on time until it has
            waited twice the hold time since its arrival.
        predictor: the output-length predictor for requests with a deadline (as spf's;
            default ``learned``).
        predictor_config: the named predictor's parameters.
        deadline_margin: the predicted work left is taken this many times when a deadline
            is turned into the next token's due time (default 1.5; 1 trusts the
            prediction exactly).

    Raises:
        ValueError: a default not > 0, the delay < 0, the margin < 1 (each named), a bad
            predictor or watermark.
    """

    name: ClassVar[str] = "edf"
    #: time constant (s) of the finish rate behind the drain time
    RATE_WINDOW_S: ClassVar[float] = 5.0
    #: a late request is held until it has waited this many hold times since arrival
    HOLD_DRAINS: ClassVar[float] = 2.0

    def __init__(self, shed_late: bool = False, default_ttft_ms: float = 10_000.0,
                 default_tpot_ms: float = 200.0, late_delay_s: float = 5.0,
                 watermark: float = 0.01, predictor: LengthPredictor | str | None = None,
                 predictor_config: dict[str, Any] | None = None,
                 deadline_margin: float = 1.5) -> None:
        super().__init__(watermark)
        if not deadline_margin >= 1:
            raise ValueError(f"deadline_margin must be >= 1, got {deadline_margin!r}")
        self.deadline_margin = deadline_margin
        for name, value in (("default_ttft_ms", default_ttft_ms),
                            ("default_tpot_ms", default_tpot_ms)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if not late_delay_s >= 0:
            raise ValueError(f"late_delay_s must be >= 0, got {late_delay_s!r}")
        self.shed_late = shed_late
        self.default_ttft_s = default_ttft_ms / 1e3
        self.default_tpot_s = default_tpot_ms / 1e3
        self.late_delay_s = late_delay_s
        self.step_s = 0.0  # mean step time, recent steps weighing most
        self.finished = self.elapsed_s = 0.0  # finishes and seconds, decayed over RATE_WINDOW_S
        self.delay_s = late_delay_s  # how long late requests are held back, this step
        self.slack_s: list[float] = []  # the waiting requests', at the last decision
        self.num_late = self.num_shed = 0
        self.predictor = make_predictor(predictor if predictor is not None else "learned",
                                        predictor_config)

    def due(self, request: RequestView) -> float:
        """When the request's next token is due (engine clock, seconds): the earliest of
        its objectives' due times for it (class docstring)."""
        last = request.last_token_time
        dues: list[float] = []
        if last is None:
            if request.ttft_slo_ms is not None:
                dues.append(request.arrival_time + request.ttft_slo_ms / 1e3)
        elif request.tpot_slo_ms is not None:
            dues.append(last + request.tpot_slo_ms / 1e3)
        if request.deadline is not None:
            left = max(self.predictor.remaining(request), 1)
            dues.append(request.deadline - (left - 1) * self.deadline_margin * self.step_s)
        if dues:
            return min(dues)
        if last is None:
            return request.arrival_time + self.default_ttft_s
        return last + self.default_tpot_s

    def late(self, request: RequestView, state: SchedulerState) -> bool:
        """Whether a request that carries an objective and has not streamed can no longer
        make its next token's due time."""
        return (request.num_output_tokens == 0 and self.due(request) < state.now + self.step_s
                and (request.ttft_slo_ms is not None or request.tpot_slo_ms is not None
                     or request.deadline is not None))

    def key(self, request: RequestView, state: SchedulerState) -> tuple[bool, bool, float, float]:
        due = self.due(request)
        held = self.late(request, state) and (
            state.now < request.arrival_time + self.HOLD_DRAINS * self.delay_s)
        return (request.num_output_tokens == 0, held, due, request.arrival_time)

    def report(self) -> PolicyReport:
        """At the last decision: ``min_slack_s`` and ``mean_slack_s`` of the waiting
        requests (seconds to their next token's due time), ``late`` of them, the
        ``hold_s`` late ones wait behind those on time, and ``step_s``, the mean step."""
        slack = self.slack_s
        return {
            "min_slack_s": min(slack) if slack else 0.0,
            "mean_slack_s": sum(slack) / len(slack) if slack else 0.0,
            "late": float(self.num_late), "hold_s": min(self.delay_s, 1e9),
            "step_s": self.step_s, "shed": float(self.num_shed),
        }

    def drain_s(self, state: SchedulerState) -> float:
        """Seconds the waiting queue takes to drain at the recent finish rate (inf before a
        request has finished)."""
        rate = self.finished / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return len(state.waiting) / rate if rate > 0 else math.inf

    def order(self, state: SchedulerState) -> Sequence[RequestView]:
        self.delay_s = min(max(self.late_delay_s, self.drain_s(state)), 6 * self.late_delay_s)
        self.slack_s = [self.due(r) - state.now for r in state.waiting]
        self.num_late = sum(self.late(r, state) for r in state.waiting)
        return super().order(state)

    def on_step(self, feedback: StepFeedback, state: SchedulerState) -> None:
        self.step_s += 0.2 * (feedback.duration_s - self.step_s)
        decay = math.exp(-feedback.duration_s / self.RATE_WINDOW_S)
        self.finished = self.finished * decay + len(feedback.finished)
        self.elapsed_s = self.elapsed_s * decay + feedback.duration_s

    def slack(self, request: RequestView, now: float) -> float:
        """Seconds a request is ahead of its objectives (its mean TPOT objective after the
        first token; its deadline less its predicted work left), so a stall costs it least."""
        first = request.first_token_time
        if first is None:
            return self.due(request) - now
        tpot = request.tpot_slo_ms / 1e3 if request.tpot_slo_ms is not None else self.default_tpot_s
        ahead = first + tpot * request.num_output_tokens - now
        if request.deadline is not None:
            left = max(self.predictor.remaining(request), 1)
            ahead = min(ahead, request.deadline - left * self.step_s - now)
        return ahead

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        """No TPOT objective nor deadline first (not streamed before streamed, newest first),
        then most slack."""
        def order(r: RequestView) -> tuple[bool, bool, float]:
            if r.tpot_slo_ms is None and r.deadline is None:
                return (False, r.first_token_time is not None, 0.0)
            return (True, r.first_token_time is not None, -self.slack(r, state.now))
        return sorted(reversed(state.running), key=order)

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        decision = super().schedule(state)
        if not self.shed_late or decision.preempt:
            return decision
        admitted = set(decision.admit)
        late = {r.request_id: "cannot meet its objective: due "
                f"{state.now - self.due(r):.3f} s ago" if self.due(r) <= state.now else
                "cannot meet its objective: due in less than a step"
                for r in state.waiting if r.request_id not in admitted
                and (r.ttft_slo_ms is not None or r.deadline is not None) and self.late(r, state)}
        self.num_shed += len(late)
        return SchedulerOutput(admit=decision.admit, shed=late) if late else decision
