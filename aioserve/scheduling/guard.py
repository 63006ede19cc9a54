"""PolicyGuard: the engine's only way to call a policy. It keeps a faulty policy's
failure to itself: a ``schedule`` that raises or returns something malformed is
replaced, for that step, by the FCFS decision; a hook that raises is skipped. Each
failure is logged (the traceback once per method) and counted. Hooks get the engine's
state snapshot when their signature takes it (contract version 3), and not otherwise
(versions 1 and 2)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence

from aioserve.scheduling.decision import SchedulerOutput
from aioserve.scheduling.feedback import StepFeedback
from aioserve.scheduling.policy import OrderedScheduler, Scheduler
from aioserve.scheduling.state import SchedulerState
from aioserve.scheduling.view import RequestView

logger = logging.getLogger(__name__)


#: The policy's hooks the guard calls (``choose_victim`` apart).
HOOKS = ("on_arrival", "on_finish", "on_preempt", "on_step")


def _no_snapshot() -> SchedulerState:
    raise RuntimeError("this engine gives its policy's hooks no state snapshot")


def _overrides(policy: object, name: str) -> bool:
    """Whether the policy's class defines hook ``name`` other than the base's no-op."""
    hook = getattr(type(policy), name, None)
    return hook is not None and hook is not getattr(Scheduler, name)


def _takes_state(policy: object, name: str) -> bool:
    """Whether the policy's hook ``name`` takes the state snapshot (contract version 3:
    a second positional parameter, or one named ``state``); hooks of versions 1 and 2
    take only the event."""
    hook = getattr(policy, name, None)
    if hook is None:
        return False
    try:
        parameters = list(inspect.signature(hook).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


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
        snapshot: makes the :class:`SchedulerState` handed to hooks that take one
            (the engine's ``snapshot``).

    Attributes:
        failures: calls that raised or returned a malformed decision, over the
            engine's life (``aioserve:scheduler_failures_total``).
        wants_steps: whether the policy overrides ``on_step`` (feedback is built only
            then).
    """

    def __init__(self, policy: Scheduler,
                 snapshot: Callable[[], SchedulerState] | None = None) -> None:
        self.policy = policy
        self.snapshot = snapshot or _no_snapshot
        self.fallback = OrderedScheduler()
        self.failures = 0
        self._logged: set[str] = set()
        self._overrides = {name: _overrides(policy, name) for name in HOOKS}
        self._takes_state = {name: _takes_state(policy, name) for name in HOOKS}
        self.wants_steps = self._overrides["on_step"]

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

    def _call(self, method: str, event: object) -> None:
        """Call the policy's hook ``method`` with ``event`` (and a fresh snapshot when
        the hook takes one); a raise is logged, counted and skipped."""
        hook = getattr(self.policy, method, None)
        if hook is None:
            return
        try:
            if self._takes_state[method]:
                hook(event, self.snapshot())
            else:
                hook(event)
        except Exception as exc:
            self._failed(method, f"{type(exc).__name__}: {exc}", exc)

    def on_arrival(self, request: RequestView) -> None:
        """The policy's ``on_arrival``; a raise is logged, counted and skipped."""
        if self._overrides["on_arrival"]:
            self._call("on_arrival", request)

    def on_finish(self, request: RequestView) -> None:
        """The policy's ``on_finish``; a raise is logged, counted and skipped."""
        if self._overrides["on_finish"]:
            self._call("on_finish", request)

    def on_preempt(self, request: RequestView) -> None:
        """The policy's ``on_preempt`` (contract version 3); a raise is logged, counted
        and skipped."""
        if self._overrides["on_preempt"]:
            self._call("on_preempt", request)

    def on_step(self, feedback: StepFeedback) -> None:
        """The policy's ``on_step``; a raise is logged, counted and skipped."""
        self._call("on_step", feedback)

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
