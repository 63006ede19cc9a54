"""EngineQueues: every request's place (waiting, running, finished) and its KV blocks;
the life of a request between steps: queued, ended, aborted, preempted, shed.

:class:`~aioserve.engine.core.EngineCore` adds the steps on top (schedule, update).
Every call into the scheduling policy goes through its
:class:`~aioserve.scheduling.guard.PolicyGuard`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping

from aioserve.kv_cache import BlockManager
from aioserve.request import FinishReason, Request, RequestStatus
from aioserve.scheduling import RequestView, Scheduler, SchedulerState
from aioserve.scheduling.guard import PolicyGuard

logger = logging.getLogger(__name__)


class EngineQueues:
    """The waiting deque, the running list, the id table and the block pool.

    Args:
        scheduler: the policy.
        blocks: the KV block pool.
        clock: time source in seconds.

    Attributes:
        guard: calls the policy, containing its failures.
        on_finish: called with every request that ends (the engine's delivery).
        num_preemptions: preemptions so far.
        num_preempted_tokens: computed tokens whose KV preemptions dropped (each is
            recomputed when its request is readmitted, less prefix-cache hits).
        num_shed: requests a policy shed so far.
        idle_s: seconds the step loop has waited with nothing to run so far
            (``clock``'s seconds).
    """

    def __init__(self, scheduler: Scheduler, blocks: BlockManager,
                 clock: Callable[[], float]) -> None:
        self.scheduler = scheduler
        self.guard = PolicyGuard(scheduler, self.snapshot)
        self.blocks = blocks
        self.clock = clock
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        #: views of ``running`` for the next snapshot (None: to be made again)
        self.running_views: tuple[RequestView, ...] | None = None
        self.requests: dict[str, Request] = {}
        self.step_count = 0
        self.num_preemptions = 0
        self.num_preempted_tokens = 0
        self.num_shed = 0
        self.idle_s = 0.0
        self.on_finish: Callable[[Request], None] | None = None
        self._released: list[str] = []
        self._new_blocks: dict[str, list[int]] = {}
        self._slots: set[str] = set()  # requests the runner holds state for
        self._finishing: set[str] = set()  # their step in flight samples their last token

    def snapshot(self) -> SchedulerState:
        """The read-only view a policy decides on (made by the engine core)."""
        raise NotImplementedError

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        """Queue a request (validated by the caller).

        Raises:
            ValueError: the id is already in use, or the prompt can never fit the KV cache.
        """
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        needed = self.blocks.blocks_for_tokens(request.num_prompt_tokens)
        if needed > self.blocks.num_blocks:
            raise ValueError(
                f"prompt of {request.num_prompt_tokens} tokens needs {needed} KV blocks, but the "
                f"KV cache holds {self.blocks.num_blocks} blocks "
                f"({self.blocks.num_blocks * self.blocks.block_size} tokens)"
            )
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.guard.on_arrival(request.view)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """End a request (any status): free its blocks and forget it."""
        if request.status is RequestStatus.FINISHED:
            return
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self.running_views = None
        else:
            self.waiting.remove(request)
        self._free_blocks(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.metrics.finished_time = self.clock()
        request.metrics.finished_step = self.step_count
        self.requests.pop(request.request_id, None)
        self._release(request)
        self.guard.on_finish(request.view)
        if self.on_finish is not None:
            self.on_finish(request)

    def abort(self, request_id: str) -> Request | None:
        """Abort a waiting or running request; returns it, or None if unknown."""
        request = self.requests.get(request_id)
        if request is not None:
            self.finish(request, FinishReason.ABORT)
        return request

    def shed(self, reasons: Mapping[str, str]) -> None:
        """End the named requests (waiting or running) because the policy refused them:
        ``error``, with the reason for their streams. Unknown ids are ignored."""
        for request_id, reason in reasons.items():
            request = self.requests.get(request_id)
            if request is not None:
                request.shed_reason = reason or "refused by the scheduling policy"
                self.num_shed += 1
                logger.info("scheduler shed %s: %s", request_id, request.shed_reason)
                self.finish(request, FinishReason.ERROR)

    def _free_blocks(self, request: Request) -> None:
        if request.block_ids:
            self.blocks.free(request.block_ids)
            request.block_ids = []

    def preempt(self, request: Request) -> None:
        """Evict a running request; it is recomputed (prompt + output) when readmitted."""
        self.running.remove(request)
        self.running_views = None
        self._free_blocks(request)
        self.num_preempted_tokens += request.num_confirmed_tokens
        request.num_computed_tokens = 0
        request.num_in_flight_tokens = 0
        request.num_output_placeholders = 0
        request.epoch += 1
        request.num_registered_blocks = 0
        request.status = RequestStatus.WAITING
        request.metrics.num_preemptions += 1
        self.waiting.appendleft(request)
        self.num_preemptions += 1
        self.guard.on_preempt(request.view)
        self._release(request)

    def _release(self, request: Request) -> None:
        """The runner drops the request's state at the next step."""
        self._finishing.discard(request.request_id)
        if request.request_id in self._slots:
            self._slots.discard(request.request_id)
            self._released.append(request.request_id)
        self._new_blocks.pop(request.request_id, None)

    def set_policy(self, scheduler: Scheduler) -> None:
        """Use another policy from the next step on (e.g. to compare policies on one
        loaded engine). The new policy hears no earlier arrival.

        Raises:
            RuntimeError: requests are waiting or running.
        """
        if self.has_work:
            raise RuntimeError("the policy can only change while the engine is idle")
        self.scheduler = scheduler
        self.guard = PolicyGuard(scheduler, self.snapshot)

    def fail(self, requests: list[Request]) -> None:
        """End the given requests with ``error`` (after a failed step). It acts on these
        requests themselves, never on their ids: one already finished is left as it is,
        and so is a request that reused its id meanwhile."""
        for request in requests:
            self.finish(request, FinishReason.ERROR)
