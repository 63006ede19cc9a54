"""EngineCore: the synchronous heart of the step loop (queues, KV blocks, batches); it
never touches the model, so it runs the same on the TorchRunner and a simulated clock."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection, Mapping

from aioserve.engine.admission import AdmissionLimit
from aioserve.engine.batch import BatchBuilder, InFlight
from aioserve.engine.prefix_cache import allocate_first_chunk, prefix_hit_lookup, register_computed
from aioserve.kv_cache import BlockManager
from aioserve.request import FinishReason, Request, RequestStatus
from aioserve.runners.base import RunnerOutput, ScheduledBatch
from aioserve.scheduling import RequestView, Scheduler, SchedulerState, StepFeedback
from aioserve.scheduling.guard import PolicyGuard

logger = logging.getLogger(__name__)

#: (request, sampled token id, index of the request in the batch)
StepResult = tuple[Request, int, int]

#: Receives every finished step (the policy's ``on_step`` is one such observer).
StepObserver = Callable[[StepFeedback], None]


class EngineCore:
    """Every request's place, its KV blocks and the per-step bookkeeping. The policy only
    decides (called through ``guard``, which contains its failures). ``schedule()`` may
    run one step ahead of ``update()`` (overlap); batches update in scheduling order."""

    def __init__(
        self,
        scheduler: Scheduler,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: tuple[int, ...],
        clock: Callable[[], float],
        admission: AdmissionLimit | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.admission = admission if admission is not None else AdmissionLimit()
        self.guard = PolicyGuard(scheduler, self.snapshot)
        self.blocks = blocks
        self.clock = clock
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.views: dict[str, RequestView] = {}  # what the policy reads of each request
        self.running_views: tuple[RequestView, ...] | None = None  # None: to be made again
        self.waiting_views: tuple[RequestView, ...] | None = None  # the same for waiting
        self.step_count = 0
        self.num_preemptions = 0
        self.num_preempted_tokens = 0  # computed tokens whose KV preemptions dropped
        self.num_shed = 0
        self.idle_s = 0.0  # seconds the step loop waited with nothing to run
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.on_finish: Callable[[Request], None] | None = None  # hears every request that ends
        self.step_observers: list[StepObserver] = []
        self._released: list[str] = []
        self._new_blocks: dict[str, list[int]] = {}
        self._slots: set[str] = set()  # requests the runner holds state for
        self._finishing: set[str] = set()  # their step in flight samples their last token
        self._stops: dict[str, int] = {}  # hidden stops (benchmarks): no policy reaches them
        self._in_flight: deque[list[InFlight]] = deque()
        self._scheduled_at: deque[float] = deque()  # when each step in flight was submitted
        self._last_step_end = float("-inf")

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request, stop_after: int | None = None) -> None:
        """Queue a request (its prompt and ``max_tokens`` validated by the caller);
        ``stop_after``: the hidden stop (benchmarks), kept here, out of every policy's reach.

        Raises:
            ValueError: the id is already in use, or the prompt can never fit the KV cache.
            QueueFullError: the admission limit's waiting queue is full.
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
        if self.admission.max_waiting is not None:
            self.admission.check(self.waiting, len(self.waiting), self.clock())
        self.requests[request.request_id] = request
        if stop_after is not None:
            self._stops[request.request_id] = stop_after
        view = self.views[request.request_id] = RequestView(request)
        self.waiting.append(request)
        if self.waiting_views is not None:
            self.waiting_views += (view,)
        self.guard.on_arrival(view)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """End a request (any status): free its blocks and forget it."""
        if request.status is RequestStatus.FINISHED:
            return
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self.running_views = None
        else:
            self.waiting.remove(request)
            self.waiting_views = None
        self._free_blocks(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.metrics.finished_time = self.clock()
        request.metrics.finished_step = self.step_count
        self.requests.pop(request.request_id, None)
        self._stops.pop(request.request_id, None)
        self._release(request)
        self.guard.on_finish(self.views.pop(request.request_id))
        if self.on_finish is not None:
            self.on_finish(request)

    def abort(self, request_id: str) -> Request | None:
        """Abort a waiting or running request; returns it, or None if unknown."""
        request = self.requests.get(request_id)
        if request is not None:
            self.finish(request, FinishReason.ABORT)
        return request

    def shed(self, reasons: Mapping[str, str]) -> None:
        """End the named requests with ``error``: the policy refused them."""
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
        if self.waiting_views is not None:
            self.waiting_views = (self.views[request.request_id], *self.waiting_views)
        self.num_preemptions += 1
        self.guard.on_preempt(self.views[request.request_id])
        self._release(request)

    def _release(self, request: Request) -> None:
        # the runner drops the request's state at the next step
        self._finishing.discard(request.request_id)
        if request.request_id in self._slots:
            self._slots.discard(request.request_id)
            self._released.append(request.request_id)
        self._new_blocks.pop(request.request_id, None)

    def set_policy(self, scheduler: Scheduler) -> None:
        """Use another policy from the next step on (the old one is closed); RuntimeError
        unless idle."""
        if self.has_work:
            raise RuntimeError("the policy can only change while the engine is idle")
        self.guard.close()
        self.scheduler = scheduler
        self.guard = PolicyGuard(scheduler, self.snapshot)

    def close(self) -> None:
        """Done with the policy: its ``close()`` (once; it saves what it learnt)."""
        self.guard.close()

    def fail(self, requests: list[Request]) -> None:
        """End these requests (not their ids, which may be reused) with ``error``."""
        for request in requests:
            self.finish(request, FinishReason.ERROR)

    def snapshot(self) -> SchedulerState:
        """The read-only state a policy decides on."""
        running, view_of = self.running, self.views
        views = self.running_views
        if self._finishing:  # their slots are free for the next step
            running = [r for r in running if r.request_id not in self._finishing]
            views = tuple([view_of[r.request_id] for r in running])
        elif views is None:
            views = self.running_views = tuple([view_of[r.request_id] for r in running])
        waiting = self.waiting_views
        if waiting is None:
            waiting = self.waiting_views = tuple([view_of[r.request_id] for r in self.waiting])
        return SchedulerState(
            waiting=waiting,
            running=views,
            num_free_blocks=self.blocks.num_free_blocks,
            num_total_blocks=self.blocks.num_blocks,
            block_size=self.blocks.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            now=self.clock(),
            step=self.step_count,
            prefix_hit=prefix_hit_lookup(self.blocks, self.requests),
            running_requests=running,
        )

    def schedule(self) -> ScheduledBatch | None:
        """Ask the policy, apply its checked decision, build the next batch (or None)."""
        if not self.waiting and not self.running:
            return None
        if self.admission.max_queue_time_s is not None:
            for late in self.admission.expired(self.waiting, self.clock()):
                self.finish(late, FinishReason.ERROR)
            if not self.waiting and not self.running:
                return None
        decision = self.guard.schedule(self.snapshot())
        if decision.shed:
            self.shed(decision.shed)
        for request_id in decision.preempt:
            request = self.requests.get(request_id)
            if request is not None and request.status is RequestStatus.RUNNING:
                self.preempt(request)
        paused, chunks = decision.pause, decision.prefill_chunk
        batch = BatchBuilder(self.max_model_len, self.blocks.block_size, self._reserve)
        budget = self._schedule_running(batch, paused, chunks)
        admit = list(decision.admit)
        if not batch.request_ids and not self.running and self.waiting and not admit:
            admit = [self.waiting[0].request_id]  # never idle with work queued
        budget = self._schedule_admissions(admit, batch, budget, chunks)
        if not batch.request_ids and paused:  # pausing would leave the step empty
            self._schedule_running(batch, (), chunks, budget)
        if not batch.request_ids:
            return None
        self._finishing.update(batch.finishing)
        self._in_flight.append(batch.record)
        self._scheduled_at.append(self.clock())
        released, self._released = self._released, []
        new_blocks, self._new_blocks = self._new_blocks, {}
        return batch.build(new_blocks, released)

    def _schedule_running(self, batch: BatchBuilder, paused: Collection[str],
                          chunks: Mapping[str, int], budget: int | None = None) -> int:
        """Schedule the running requests' next tokens, skipping ``paused``; returns the
        budget left."""
        # a copy of the list: _reserve may preempt
        running = [r for r in self.running if r.request_id not in paused] if paused else list(
            self.running)
        if budget is None:
            budget = self.max_num_batched_tokens
        return batch.add_running(running, budget, chunks)

    def _reserve(self, request: Request, count: int, scheduled: list[str]) -> bool:
        """Give ``request`` the blocks for ``count`` more tokens, preempting unscheduled
        running requests (the policy's ``victims``; by default the newest) if needed. A request
        alone that cannot grow ends with ``length``."""
        need = self.blocks.blocks_for_tokens(request.num_computed_tokens + count)
        need -= len(request.block_ids)
        while need > self.blocks.num_free_blocks:
            busy = set(scheduled)
            candidates = [r for r in reversed(self.running) if r.request_id not in busy]
            if not candidates or (candidates[0] is request and len(self.running) == 1):
                if request.num_output_placeholders:
                    return False  # first take the token its step in flight samples
                logger.warning(
                    "KV cache full: ending %s at %d tokens", request.request_id, request.num_tokens
                )
                self.finish(request, FinishReason.LENGTH)
                return False
            index = 0
            if len(candidates) > 1:
                view_of = self.views
                index = self.guard.victim([view_of[r.request_id] for r in candidates])
            victim = candidates[index]
            self.preempt(victim)
            if victim is request:
                return False
        new = self.blocks.allocate(need) or []
        request.block_ids.extend(new)
        self._new_blocks.setdefault(request.request_id, []).extend(new)
        return True

    def _schedule_admissions(self, admit: list[str], batch: BatchBuilder, budget: int,
                             chunks: Mapping[str, int]) -> int:
        """Admit in order while slots, budget and blocks allow; returns the budget left."""
        now = self.clock()
        for request_id in admit:
            request = self.requests.get(request_id)
            if request is None or request.status is not RequestStatus.WAITING:
                continue
            if len(self.running) - len(self._finishing) >= self.max_num_seqs or budget <= 0:
                break
            limit = min(budget, chunks[request_id]) if request_id in chunks else budget
            cached = allocate_first_chunk(self.blocks, request, limit)
            if cached is None:
                break
            if self.blocks.enable_caching:
                self.prefix_cache_queries += request.num_tokens
                self.prefix_cache_hits += cached
            count = min(request.num_tokens - request.num_computed_tokens, limit)
            views = self.waiting_views
            if self.waiting[0] is request:  # the usual case: the head, views sliced in C
                self.waiting.popleft()
                self.waiting_views = None if views is None else views[1:]
            else:
                self.waiting.remove(request)
                self.waiting_views = None
            self.running.append(request)
            self.running_views = None
            request.status = RequestStatus.RUNNING
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
                # the index of the step it runs in (steps ended + the one in flight)
                request.metrics.first_scheduled_step = self.step_count + len(self._in_flight)
            self._slots.add(request_id)
            batch.add_new(request, count)
            budget -= count
        return budget

    def update(self, batch: ScheduledBatch, output: RunnerOutput) -> list[StepResult]:
        """Take the oldest scheduled batch's sampled tokens: append them, end requests on
        EOS, stop ids, ``max_tokens`` or the context length (requests preempted or ended
        since it was scheduled drop theirs), then tell the step observers."""
        record = self._in_flight.popleft()
        scheduled_at = self._scheduled_at.popleft()
        self.step_count += 1
        now = self.clock()
        results: list[StepResult] = []
        add_result = results.append
        running = RequestStatus.RUNNING
        sampled = output.token_ids
        caching = self.blocks.block_size if self.blocks.enable_caching else 0
        eos, max_model_len, stops = self.eos_token_ids, self.max_model_len, self._stops
        for index, (request, epoch, count, samples) in enumerate(record):
            if request.status is not running or request.epoch != epoch:
                continue  # finished, aborted or preempted while the step ran
            request.num_in_flight_tokens -= count
            if caching and request.num_confirmed_tokens >= (
                caching * (request.num_registered_blocks + 1)
            ):  # a block just filled up
                register_computed(self.blocks, request)
            if not samples:
                continue
            request.num_output_placeholders -= 1
            token = sampled[index]
            out = request.output_token_ids
            out.append(token)
            metrics = request.metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now
            add_result((request, token, index))
            params = request.params
            if token in params.stop_token_ids or (token in eos and not params.ignore_eos):
                self.finish(request, FinishReason.STOP)
            elif stops and len(out) >= stops.get(request.request_id, max_model_len + 1):
                self.finish(request, FinishReason.STOP)  # the hidden stop (benchmarks)
            elif len(out) >= params.max_tokens or (
                len(request.prompt_token_ids) + len(out) >= max_model_len
            ):
                self.finish(request, FinishReason.LENGTH)
        start, self._last_step_end = max(scheduled_at, self._last_step_end), now
        if self.step_observers or self.guard.wants_steps:
            self._report_step(batch, results, start, now)
        return results

    def _report_step(self, batch: ScheduledBatch, results: list[StepResult], start: float,
                     end: float) -> None:
        emitted = [0] * len(batch.request_ids)
        finished: list[str] = []
        done = RequestStatus.FINISHED
        for request, _, index in results:
            emitted[index] = 1
            if request.status is done:
                finished.append(request.request_id)
        counts = batch.num_scheduled_tokens
        decode = tuple([n == 1 and p > 0 for n, p in zip(counts, batch.num_output_tokens)])
        feedback = StepFeedback(
            self.step_count - 1, start, end, tuple(batch.request_ids), tuple(counts),
            tuple(batch.start_positions), tuple(emitted), decode, tuple(finished),
        )
        for observer in self.step_observers:
            observer(feedback)
        if self.guard.wants_steps:
            self.guard.on_step(feedback)

    def oldest_batch_record(self) -> list[InFlight]:
        """The rows of the oldest scheduled batch (the next :meth:`update` or
        :meth:`abandon`), which both leave as they are."""
        return self._in_flight[0]

    def abandon(self, batch: ScheduledBatch) -> None:
        """Forget the oldest scheduled batch, whose step failed."""
        self._in_flight.popleft()
        self._last_step_end = self.clock()
        self._scheduled_at.popleft()
