"""The policy classes: :class:`Scheduler` (the contract) and :class:`OrderedScheduler`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, TypeAlias

from aioserve.scheduling.decision import SchedulerOutput
from aioserve.scheduling.feedback import StepFeedback
from aioserve.scheduling.state import SchedulerState
from aioserve.scheduling.view import RequestView

#: The contract's version (docs/schedulers.md); 1.0 on, a change keeps what it declared.
CONTRACT_VERSION = "1.0"

#: What :meth:`Scheduler.report` returns: plain numbers by name, or one level of numbers
#: keyed by a label (a tenant, a priority level, an MLFQ queue, a request id).
PolicyReport: TypeAlias = dict[str, float | dict[str, float]]


class Scheduler:
    """Base class of scheduling policies (contract 1.0): every policy subclasses it.

    A policy decides; the engine owns every queue and block and checks every decision.
    Subclasses set ``name`` and implement :meth:`schedule`; everything else is optional.
    Constructor parameters come from ``--scheduler-config`` /
    ``EngineConfig.scheduler_config`` (JSON), so give each a default. A method that
    raises is contained: the engine logs it, counts it and goes on (a failed
    :meth:`schedule` is replaced by the FCFS decision for that step).

    Preemption has one rule: a policy evicts for its own reasons (priority, fairness) by
    naming ids in ``SchedulerOutput.preempt``; when KV blocks run short, whoever evicts
    (``state.preempt_for_growth`` before a step, the engine during one) takes
    :meth:`OrderedScheduler.victims` in order (newest first for any other policy).
    Either way :meth:`on_preempt` follows.

    Every hook receives ``state``: a snapshot taken when the hook is called, after its
    event (the request is already waiting, gone, or back at the head of the waiting
    queue): what the next :meth:`schedule` sees unless other events come first.

    Timing: the engine schedules one step ahead, so :meth:`schedule` for step N+1 runs
    before step N's :meth:`on_step`. Charge what an admission costs when you admit it
    (in :meth:`schedule`); use :meth:`on_step` for what only the step tells (tokens
    emitted, time taken). :meth:`close` comes last, once, when the engine is done with
    the policy.
    """

    name: ClassVar[str] = ""
    #: A policy that predicts output lengths: ``(request id, tokens predicted at arrival,
    #: true tokens)`` of requests that ended by a stop or their cap, the newest last (read by
    #: ``/metrics`` and the reports); empty for any other.
    outcomes: Sequence[tuple[str, int, int]] = ()
    #: The entries of :meth:`report` keyed by tenant (labelled by the server's tenant rule).
    report_tenant_keys: ClassVar[frozenset[str]] = frozenset()

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        """Decide the next step from ``state`` (a frozen snapshot); the engine applies what is
        valid in the returned decision and ignores the rest."""
        raise NotImplementedError

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        """A request joined the waiting queue."""

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        """A request finished, for any reason."""

    def on_preempt(self, request: RequestView, state: SchedulerState) -> None:
        """A running request was preempted: its blocks are freed and it waits at the
        head of the queue, to be recomputed when readmitted."""

    def on_step(self, feedback: StepFeedback, state: SchedulerState) -> None:
        """A step finished (after the next one was scheduled); called only when overridden."""

    def report(self) -> PolicyReport:
        """What the policy thinks now, as plain numbers it chooses (VTC's counters per
        tenant, MLFQ's level occupancy, predicted remaining lengths, EDF's slack). Read by
        the live page, ``/metrics`` and the simulator's report between steps; it must not
        change the policy's state. A value keyed by tenant is labelled by the server's one
        tenant-label rule (``aioserve/server/tenant_labels.py``). Default: nothing."""
        return {}

    def close(self) -> None:
        """The engine shut down, the simulator's run ended or the policy was replaced:
        save or release what the policy holds (a learned predictor's state). Called once,
        with no ``state``, after the last hook; contained like a hook."""


class OrderedScheduler(Scheduler):
    """A policy that is an order, on the engine's shared admission arithmetic.

    Each step: if the running requests need more KV blocks than are free, preempt from
    :meth:`victims` until they fit, and admit nothing; otherwise admit waiting requests
    by :meth:`key` (ties in queue order) while slots, the token budget and free blocks
    allow, keeping ``watermark`` of all blocks free while something runs, and stop at
    the first that does not fit. With the default key this is vLLM's FCFS.

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
        """Sort key of a waiting request, smallest admitted first (default: queue order)."""
        return 0

    def order(self, state: SchedulerState) -> Sequence[RequestView]:
        """The waiting requests in admission order (stable sort by :meth:`key`)."""
        return sorted(state.waiting, key=lambda request: self.key(request, state))

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        """Running requests in the order to evict them when KV blocks run short
        (default: newest admission first, as vLLM's FCFS). The engine, short of blocks
        mid-step, evicts the first of these it may (one not yet scheduled this step)."""
        return reversed(state.running)

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        preempt = state.preempt_for_growth(self.victims(state))
        if preempt:
            return SchedulerOutput(preempt=preempt)
        reserve = int(self.watermark * state.num_total_blocks)
        return SchedulerOutput(admit=state.admission().fill(self.order(state), reserve))
