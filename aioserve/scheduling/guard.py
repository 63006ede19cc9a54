"""PolicyGuard: the engine's only way to call a policy. It keeps a faulty policy's
failure to itself: a ``schedule`` that raises or returns something malformed is
replaced, for that step, by the FCFS decision; a hook that raises is skipped. Each
failure is logged (the traceback once per method) and counted."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from aioserve.scheduling.decision import SchedulerOutput
from aioserve.scheduling.feedback import StepFeedback
from aioserve.scheduling.policy import OrderedScheduler, Scheduler
from aioserve.scheduling.state import SchedulerState
from aioserve.scheduling.view import RequestView

logger = logging.getLogger(__name__)


def _ids(values: object) -> bool:
    return isinstance(values, (Sequence, set, frozenset)) and not isinstance(values, str) and all(
        isinstance(v, str) for v in values)


def malformed(decision: object) -> str | None:
    """Why a decision cannot be applied, or None when it can."""
    if not isinstance(decision, SchedulerOutput):
        return f"schedule() returned {type(decision).__name__}, not a SchedulerOutput"
    for name in ("admit", "preempt", "pause"):
        if not _ids(getattr(decision, name)):
            return f"SchedulerOutput.{name} must be a list of request ids (strings)"
    shed, chunks = decision.shed, decision.prefill_chunk
    if not isinstance(shed, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in shed.items()):
        return "SchedulerOutput.shed must map request ids to reasons (strings)"
    if not isinstance(chunks, Mapping) or not all(
            isinstance(k, str) and type(v) is int and v >= 1 for k, v in chunks.items()):
        return "SchedulerOutput.prefill_chunk must map request ids to integers >= 1"
    return None


class PolicyGuard:
    """Calls one policy for the engine, containing its failures.

    Args:
        policy: the scheduling policy.

    Attributes:
        failures: calls that raised or returned a malformed decision, over the
            engine's life (``aioserve:scheduler_failures_total``).
        wants_steps: whether the policy overrides ``on_step`` (feedback is built only
            then).
    """

    def __init__(self, policy: Scheduler) -> None:
        self.policy = policy
        self.fallback = OrderedScheduler()
        self.failures = 0
        self._logged: set[str] = set()
        hook = getattr(type(policy), "on_step", None)
        self.wants_steps = hook is not None and hook is not Scheduler.on_step

    def _failed(self, method: str, error: str, exc: BaseException | None = None) -> None:
        self.failures += 1
        first = method not in self._logged
        self._logged.add(method)
        then = "using the FCFS decision for this step" if method == "schedule" else "skipped"
        logger.error("scheduler %r: %s failed (%s); %s [failure %d]", self.policy, method,
                     error, then, self.failures, exc_info=exc if first else None)

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        """The policy's decision, or the FCFS decision when it fails."""
        try:
            decision = self.policy.schedule(state)
        except Exception as exc:
            self._failed("schedule", f"{type(exc).__name__}: {exc}", exc)
            return self.fallback.schedule(state)
        problem = malformed(decision)
        if problem is not None:
            self._failed("schedule", problem)
            return self.fallback.schedule(state)
        return decision

    def on_arrival(self, request: RequestView) -> None:
        """The policy's ``on_arrival``; a raise is logged, counted and skipped."""
        try:
            self.policy.on_arrival(request)
        except Exception as exc:
            self._failed("on_arrival", f"{type(exc).__name__}: {exc}", exc)

    def on_finish(self, request: RequestView) -> None:
        """The policy's ``on_finish``; a raise is logged, counted and skipped."""
        try:
            self.policy.on_finish(request)
        except Exception as exc:
            self._failed("on_finish", f"{type(exc).__name__}: {exc}", exc)

    def on_step(self, feedback: StepFeedback) -> None:
        """The policy's ``on_step``; a raise is logged, counted and skipped."""
        try:
            self.policy.on_step(feedback)
        except Exception as exc:
            self._failed("on_step", f"{type(exc).__name__}: {exc}", exc)

    def choose_victim(self, requester: RequestView, candidates: Sequence[RequestView]) -> int:
        """Index into ``candidates`` of the request to preempt (0, the newest, unless
        the policy names another candidate)."""
        choose = getattr(self.policy, "choose_victim", None)
        if choose is None:
            return 0
        try:
            chosen = choose(requester, candidates)
        except Exception as exc:
            self._failed("choose_victim", f"{type(exc).__name__}: {exc}", exc)
            return 0
        if chosen is None:
            return 0
        for index, candidate in enumerate(candidates):
            if candidate.request_id == chosen:
                return index
        self._failed("choose_victim", f"{chosen!r} is not one of the candidates")
        return 0
