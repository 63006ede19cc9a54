"""PolicyGuard: the engine's only way to call a policy, containing its failures."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from aioserve.scheduling.decision import SchedulerOutput
from aioserve.scheduling.feedback import StepFeedback
from aioserve.scheduling.policy import OrderedScheduler, Scheduler
from aioserve.scheduling.state import SchedulerState
from aioserve.scheduling.view import RequestView

logger = logging.getLogger(__name__)

T = TypeVar("T")


#: The policy's hooks the guard calls.
HOOKS = ("on_arrival", "on_finish", "on_preempt", "on_step")


def _overrides(policy: Scheduler, name: str) -> bool:
    """Whether the policy's class defines ``name`` other than the base's."""
    return getattr(type(policy), name, None) not in (None, getattr(OrderedScheduler, name, None))


def _ids(values: object) -> bool:
    if isinstance(values, (list, tuple)):  # the usual case, without an ABC check
        return all(isinstance(v, str) for v in values)
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
    """Calls one policy for the engine: a ``schedule`` that raises or returns something
    malformed is replaced, for that step, by the FCFS decision; any other method that
    raises is skipped. Each failure is logged (the traceback once per method) and
    counted in ``failures`` (``aioserve:scheduler_failures_total``). ``snapshot`` makes
    the state handed to the hooks and ``victims``; ``wants_steps`` says whether the policy
    overrides ``on_step`` (feedback is built only then)."""

    def __init__(self, policy: Scheduler, snapshot: Callable[[], SchedulerState]) -> None:
        self.policy = policy
        self.snapshot = snapshot
        self.fallback = OrderedScheduler()
        self.failures = 0
        self._logged: set[str] = set()
        self._closed = False
        self._overrides = {name: _overrides(policy, name) for name in HOOKS}
        self.wants_steps = self._overrides["on_step"]
        self._victims = (policy.victims if isinstance(policy, OrderedScheduler)
                         and _overrides(policy, "victims") else None)

    def _failed(self, method: str, error: str, exc: BaseException | None = None) -> None:
        self.failures += 1
        first = method not in self._logged
        self._logged.add(method)
        then = "using the FCFS decision for this step" if method == "schedule" else "skipped"
        logger.error("scheduler %r: %s failed (%s); %s [failure %d]", self.policy, method,
                     error, then, self.failures, exc_info=exc if first else None)

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
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

    def _call(self, method: str, hook: Callable[[T, SchedulerState], None], event: T) -> None:
        if not self._overrides[method]:
            return
        try:
            hook(event, self.snapshot())
        except Exception as exc:
            self._failed(method, f"{type(exc).__name__}: {exc}", exc)

    def on_arrival(self, request: RequestView) -> None:
        self._call("on_arrival", self.policy.on_arrival, request)

    def on_finish(self, request: RequestView) -> None:
        self._call("on_finish", self.policy.on_finish, request)

    def on_preempt(self, request: RequestView) -> None:
        self._call("on_preempt", self.policy.on_preempt, request)

    def on_step(self, feedback: StepFeedback) -> None:
        self._call("on_step", self.policy.on_step, feedback)

    def close(self) -> None:
        """The policy's ``close()``, once."""
        if self._closed:
            return
        self._closed = True
        try:
            self.policy.close()
        except Exception as exc:
            self._failed("close", f"{type(exc).__name__}: {exc}", exc)

    def victim(self, candidates: Sequence[RequestView]) -> int:
        """Index into ``candidates`` (newest first) of the request the engine evicts: the
        first of the policy's ``victims`` among them; 0 when it names none."""
        if self._victims is None:
            return 0
        index = {c.request_id: i for i, c in enumerate(candidates)}
        try:
            order = self._victims(self.snapshot())
            return next((index[v.request_id] for v in order if v.request_id in index), 0)
        except Exception as exc:
            self._failed("victims", f"{type(exc).__name__}: {exc}", exc)
        return 0
