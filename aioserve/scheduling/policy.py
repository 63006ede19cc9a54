"""The policy classes: :class:`Scheduler` (the contract) and :class:`OrderedScheduler`
(a policy that is an order: a sort key for admissions, an order of victims)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from aioserve.scheduling.decision import SchedulerOutput
from aioserve.scheduling.feedback import StepFeedback
from aioserve.scheduling.state import SchedulerState
from aioserve.scheduling.view import RequestView

#: The version of the contract this module defines (see docs/schedulers.md). Version 3
#: added ``on_preempt`` and the state snapshot handed to every hook; policies written for
#: versions 1 and 2 (hooks without ``state``) load and run unchanged.
CONTRACT_VERSION = 3


class Scheduler:
    """Base class of scheduling policies (contract version 3).

    A policy decides; the engine owns every queue and block and checks every decision.
    Subclasses set ``name`` and implement :meth:`schedule`; the hooks are optional. A
    policy's constructor parameters come from ``--scheduler-config`` /
    ``EngineConfig.scheduler_config`` (JSON), so give each one a default. Any method
    that raises is contained: the engine logs it, counts it and goes on (a failed
    :meth:`schedule` is replaced by the FCFS decision for that step).

    Every hook receives ``state``: a snapshot of the engine taken when the hook is
    called, after the event it reports (the request is already in the waiting queue, out
    of the engine, or back in the waiting queue): the state the next :meth:`schedule`
    sees unless other events come first. A hook written without the ``state`` parameter
    (contract versions 1 and 2) is called without it, and no snapshot is built for it.

    Timing: the engine schedules one step ahead, so :meth:`schedule` for step N+1 runs
    before step N's :meth:`on_step`; service counted only in :meth:`on_step` is one
    step late, and a policy that orders by it admits the same client twice. Charge
    what an admission will cost when you admit (in :meth:`schedule`), and use
    :meth:`on_step` for what only the step can tell (tokens emitted, time taken).
    """

    name: ClassVar[str] = ""
    contract_version: ClassVar[int] = CONTRACT_VERSION

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        """Decide which waiting requests to admit, which running ones to preempt, pause
        or shed, and how much each may prefill this step."""
        raise NotImplementedError

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        """A request joined the waiting queue (hook; default does nothing)."""

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        """A request finished, for any reason (hook; default does nothing)."""

    def on_preempt(self, request: RequestView, state: SchedulerState) -> None:
        """A running request was preempted (by the policy's decision or for another's
        KV growth): its blocks are freed and it is back at the head of the waiting
        queue, to be recomputed when readmitted (hook; default does nothing)."""

    def on_step(self, feedback: StepFeedback, state: SchedulerState) -> None:
        """A step finished: per request, tokens computed and emitted; the step's time.
        Arrives after the next step was scheduled (one step late, see above). Called
        only when a policy overrides it (hook; default does nothing)."""

    def choose_victim(
        self, requester: RequestView, candidates: Sequence[RequestView]
    ) -> str | None:
        """The engine must free KV blocks so that ``requester`` can grow this step:
        name the running request to preempt, one of ``candidates`` (newest admission
        first; the requester may be among them). None keeps the engine's default, the
        first candidate (the newest, as vLLM's FCFS). Called again while blocks are
        still short."""
        return None


class OrderedScheduler(Scheduler):
    """A policy defined by orders, on the engine's shared admission arithmetic.

    Each step: if the running requests need more KV blocks than are free, preempt from
    :meth:`victims` (newest first by default) until they fit, and admit nothing;
    otherwise admit waiting requests in :meth:`order` (by :meth:`key`, ties in queue
    order) while slots, the token budget and free blocks allow, keeping ``watermark``
    of all blocks free while something runs, and stop at the first that does not fit.
    With the default key this is vLLM's FCFS.

    Args:
        watermark: fraction of all KV blocks kept free at admission, so running
            requests can grow without immediate preemption (vLLM's default, 0.01).

    Raises:
        ValueError: watermark outside [0, 1).
    """

    def __init__(self, watermark: float = 0.01) -> None:
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {watermark!r}")
        self.watermark = watermark

    def key(self, request: RequestView, state: SchedulerState) -> Any:
        """Sort key of a waiting request (smaller is admitted first); default: none,
        so the queue order (preempted first, then arrival) stands."""
        return 0

    def order(self, state: SchedulerState) -> Sequence[RequestView]:
        """The waiting requests in admission order (stable sort by :meth:`key`)."""
        return sorted(state.waiting, key=lambda request: self.key(request, state))

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        """Running requests in the order to preempt them under memory pressure
        (default: newest admission first)."""
        return reversed(state.running)

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        preempt = state.preempt_for_growth(self.victims(state))
        if preempt:
            return SchedulerOutput(preempt=preempt)
        reserve = int(self.watermark * state.num_total_blocks)
        return SchedulerOutput(admit=state.admission().fill(self.order(state), reserve))
