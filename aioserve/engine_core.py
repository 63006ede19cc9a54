"""EngineCore: the synchronous heart of the step loop (queues, blocks, batches).

It owns every request's state and the BlockManager; with prefix caching on, admission
starts a request after its longest cached prefix, and ``update()`` offers blocks to
the cache once they are full of computed tokens. A scheduler plugin only
decides; ``schedule()`` checks and applies its decision, ``update()`` takes the
runner's tokens. It never touches the model or the tokenizer, so the same core runs
on the TorchRunner and on a simulated clock.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from aioserve.batch_builder import BatchBuilder, InFlight
from aioserve.kv_cache import BlockManager
from aioserve.prefix_cache import allocate_first_chunk, prefix_hit_lookup, register_computed
from aioserve.request import FinishReason, Request, RequestStatus
from aioserve.runners.base import RunnerOutput, ScheduledBatch
from aioserve.scheduling import Scheduler, SchedulerState

logger = logging.getLogger(__name__)

#: (request, sampled token id, index of the request in the batch)
StepResult = tuple[Request, int, int]



class EngineCore:
    """Queues, KV blocks and the per-step bookkeeping.

    Scheduling may run one step ahead (overlapped scheduling): ``schedule()`` may be
    called again before the previous batch's ``update()``; a request in that step then
    counts its token being sampled as a placeholder and decodes from it. Batches are
    updated in the order they were scheduled.

    Args:
        scheduler: the policy.
        blocks: the KV block pool.
        max_num_seqs: slots.
        max_num_batched_tokens: token budget per step.
        max_model_len: context length in tokens.
        eos_token_ids: ids that end a request unless it ignores EOS.
        clock: time source in seconds.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: tuple[int, ...],
        clock: Callable[[], float],
    ) -> None:
        self.scheduler = scheduler
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.clock = clock
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.step_count = 0
        self.num_preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.on_finish: Callable[[Request], None] | None = None
        self._released: list[str] = []
        self._in_flight: deque[list[InFlight]] = deque()
        self._new_blocks: dict[str, list[int]] = {}
        self._slots: set[str] = set()  # requests the runner holds state for
        self._finishing: set[str] = set()  # their step in flight samples their last token

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
        self.scheduler.on_arrival(request)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """End a request (any status): free its blocks and forget it."""
        if request.status is RequestStatus.FINISHED:
            return
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._free_blocks(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.metrics.finished_time = self.clock()
        request.metrics.finished_step = self.step_count
        self.requests.pop(request.request_id, None)
        self._release(request)
        self.scheduler.on_finish(request)
        if self.on_finish is not None:
            self.on_finish(request)

    def abort(self, request_id: str) -> Request | None:
        """Abort a waiting or running request; returns it, or None if unknown."""
        request = self.requests.get(request_id)
        if request is not None:
            self.finish(request, FinishReason.ABORT)
        return request

    def _free_blocks(self, request: Request) -> None:
        if request.block_ids:
            self.blocks.free(request.block_ids)
            request.block_ids = []

    def preempt(self, request: Request) -> None:
        """Evict a running request; it is recomputed (prompt + output) when readmitted."""
        self.running.remove(request)
        self._free_blocks(request)
        request.num_computed_tokens = 0
        request.num_in_flight_tokens = 0
        request.num_output_placeholders = 0
        request.epoch += 1
        request.num_registered_blocks = 0
        request.status = RequestStatus.WAITING
        request.metrics.num_preemptions += 1
        self.waiting.appendleft(request)
        self.num_preemptions += 1
        self._release(request)

    def _release(self, request: Request) -> None:
        """The runner drops the request's state at the next step."""
        self._finishing.discard(request.request_id)
        if request.request_id in self._slots:
            self._slots.discard(request.request_id)
            self._released.append(request.request_id)
        self._new_blocks.pop(request.request_id, None)

    def snapshot(self) -> SchedulerState:
        """The read-only view a policy decides on."""
        running = self.running
        if self._finishing:  # their slots are free for the next step
            running = [r for r in running if r.request_id not in self._finishing]
        return SchedulerState(
            waiting=tuple(self.waiting),
            running=tuple(running),
            num_free_blocks=self.blocks.num_free_blocks,
            num_total_blocks=self.blocks.num_blocks,
            block_size=self.blocks.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            now=self.clock(),
            step=self.step_count,
            prefix_hit=prefix_hit_lookup(self.blocks, self.requests),
        )

    def schedule(self) -> ScheduledBatch | None:
        """Ask the policy, apply its checked decision, and build the next batch
        (None when there is nothing to run)."""
        if not self.waiting and not self.running:
            return None
        decision = self.scheduler.schedule(self.snapshot())
        for request_id in decision.preempt:
            request = self.requests.get(request_id)
            if request is not None and request.status is RequestStatus.RUNNING:
                self.preempt(request)
        batch = BatchBuilder(self.max_model_len, self.blocks.block_size, self._reserve)
        budget = self._schedule_running(batch)
        admit = list(decision.admit)
        if not batch.request_ids and not self.running and self.waiting and not admit:
            admit = [self.waiting[0].request_id]  # never idle with work queued
        self._schedule_admissions(admit, batch, budget)
        if not batch.request_ids:
            return None
        self._finishing.update(batch.finishing)
        self._in_flight.append(batch.record)
        released, self._released = self._released, []
        new_blocks, self._new_blocks = self._new_blocks, {}
        return batch.build(new_blocks, released)

    def _schedule_running(self, batch: BatchBuilder) -> int:
        """Schedule the running requests' next tokens (decode, or the rest of a
        chunked prefill) within the token budget; returns the budget left."""
        # a copy of the list: _reserve may preempt
        return batch.add_running(list(self.running), self.max_num_batched_tokens)

    def _reserve(self, request: Request, count: int, scheduled: list[str]) -> bool:
        """Give ``request`` the blocks for ``count`` more tokens, preempting the newest
        unscheduled running requests if needed (the request itself when it is the
        newest). A request alone that cannot grow ends with ``length`` (after the
        token its step in flight samples, if any)."""
        need = self.blocks.blocks_for_tokens(request.num_computed_tokens + count)
        need -= len(request.block_ids)
        while need > self.blocks.num_free_blocks:
            busy = set(scheduled)
            victim = next((r for r in reversed(self.running) if r.request_id not in busy), None)
            if victim is None or (victim is request and len(self.running) == 1):
                if request.num_output_placeholders:
                    return False  # first take the token its step in flight samples
                logger.warning(
                    "KV cache full: ending %s at %d tokens", request.request_id, request.num_tokens
                )
                self.finish(request, FinishReason.LENGTH)
                return False
            self.preempt(victim)
            if victim is request:
                return False
        new = self.blocks.allocate(need) or []
        request.block_ids.extend(new)
        self._new_blocks.setdefault(request.request_id, []).extend(new)
        return True

    def _schedule_admissions(self, admit: list[str], batch: BatchBuilder, budget: int) -> None:
        now = self.clock()
        for request_id in admit:
            request = self.requests.get(request_id)
            if request is None or request.status is not RequestStatus.WAITING:
                continue
            if len(self.running) - len(self._finishing) >= self.max_num_seqs or budget <= 0:
                break
            cached = allocate_first_chunk(self.blocks, request, budget)
            if cached is None:
                break
            if self.blocks.enable_caching:
                self.prefix_cache_queries += request.num_tokens
                self.prefix_cache_hits += cached
            count = min(request.num_tokens - request.num_computed_tokens, budget)
            self.waiting.remove(request)
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
                # the index of the step it runs in (steps ended + the one in flight)
                request.metrics.first_scheduled_step = self.step_count + len(self._in_flight)
            self._slots.add(request_id)
            batch.add_new(request, count)
            budget -= count

    def update(self, batch: ScheduledBatch, output: RunnerOutput) -> list[StepResult]:
        """Take the oldest scheduled batch's sampled tokens: confirm its computed
        tokens, append tokens, end requests on EOS, stop ids, ``max_tokens`` or the
        context length. Requests preempted or finished since it was scheduled are
        skipped (their tokens are dropped)."""
        record = self._in_flight.popleft()
        self.step_count += 1
        now = self.clock()
        results: list[StepResult] = []
        add_result = results.append
        running = RequestStatus.RUNNING
        sampled = output.token_ids
        caching = self.blocks.block_size if self.blocks.enable_caching else 0
        eos, max_model_len = self.eos_token_ids, self.max_model_len
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
            elif len(out) >= params.max_tokens or (
                len(request.prompt_token_ids) + len(out) >= max_model_len
            ):
                self.finish(request, FinishReason.LENGTH)
        return results

    def abandon(self, batch: ScheduledBatch) -> None:
        """Forget the oldest scheduled batch, whose step failed (its requests are
        being ended by the caller)."""
        self._in_flight.popleft()

    def fail(self, request_ids: list[str]) -> list[Request]:
        """End the given requests with ``error`` (after a failed step); returns them."""
        failed = [self.requests[r] for r in request_ids if r in self.requests]
        for request in failed:
            self.finish(request, FinishReason.ERROR)
        return failed
