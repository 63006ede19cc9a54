"""AsyncEngine: the asyncio front end and the step-loop task."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from aioserve.config import EngineConfig
from aioserve.engine.admission import AdmissionLimit
from aioserve.engine.core import EngineCore, StepObserver
from aioserve.engine.observation import EngineListener, ListenerHub, StepSnapshot
from aioserve.engine.output import Delivery, RequestStream
from aioserve.engine.step_loop import StepLoop
from aioserve.errors import EngineError, EngineNotRunningError
from aioserve.kv_cache import BlockManager
from aioserve.outputs import RequestOutput
from aioserve.prompts import encode_prompt
from aioserve.request import Request
from aioserve.request_meta import RequestMeta
from aioserve.runners.base import ModelRunner, RunnerInfo
from aioserve.sampling_params import SamplingParams
from aioserve.scheduling import Scheduler
from aioserve.scheduling.registry import load_scheduler

logger = logging.getLogger(__name__)


class AsyncEngine:
    """An asyncio LLM engine with continuous batching and a pluggable scheduler.

    ``async with AsyncEngine(config) as engine`` loads the model off the event loop and
    starts the step loop task: schedule, await one model step, update, fan out.

    Args:
        config: the engine configuration.
        runner: a ready runner (e.g. ``SimulatedRunner``); default loads a
            ``TorchRunner`` for ``config.model``.
        tokenizer: a transformers fast tokenizer; default loads the model's own when
            no runner is given. Without one, prompts must be token ids and outputs
            carry no text.
        scheduler: a policy instance or name, overriding ``config.scheduler``.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        runner: ModelRunner | None = None,
        tokenizer: Any = None,
        scheduler: Scheduler | str | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self._scheduler_spec = scheduler if scheduler is not None else config.scheduler
        self.core: EngineCore | None = None
        self._delivery = Delivery()
        self.listeners = ListenerHub()
        self._step_observers: list[StepObserver] = []
        self.step_loop: StepLoop | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self._draining = False
        self._closed = False

    async def start(self) -> None:
        """Load the model and tokenizer and start the step loop.

        Raises:
            ValueError: unknown scheduler, or parameters it refuses. OSError: the model
                cannot be loaded.
        """
        params = self.config.scheduler_config if isinstance(self._scheduler_spec, str) else None
        scheduler = load_scheduler(self._scheduler_spec, params)
        if self.runner is None:
            from aioserve.runners.torch.runner import TorchRunner

            self.runner = await asyncio.to_thread(TorchRunner, self.config)
            if self.tokenizer is None:
                from transformers import AutoTokenizer

                name = self.config.tokenizer or self.config.model
                self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, name)
        runner = self.runner
        eos = set(runner.eos_token_ids)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.core = EngineCore(
            scheduler,
            BlockManager(
                runner.num_kv_blocks, runner.block_size, self.config.enable_prefix_caching
            ),
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_model_len=runner.max_model_len,
            eos_token_ids=tuple(sorted(eos)),
            clock=runner.clock,
            admission=AdmissionLimit(self.config.max_waiting, self.config.max_queue_time_s),
        )
        self.core.on_finish = self._on_finish
        self.core.step_observers = self._step_observers  # shared: added later, seen at once
        # What start-up allocated (model, tokenizer, modules) lives as long as the
        # engine: out of the collector's generations, a collection during the step
        # loop scans only what the loop allocates (vLLM freezes its heap likewise).
        gc.collect()
        gc.freeze()
        self.step_loop = StepLoop(self.core, runner, self._delivery, self.listeners)
        self._loop_task = asyncio.create_task(self.step_loop.run(), name="aioserve-step-loop")
        self._loop_task.add_done_callback(self._on_loop_done)

    async def shutdown(self) -> None:
        """Stop the step loop, end every open stream with EngineNotRunningError, close the
        policy (it saves what it learnt) and release the runner (idempotent)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        if self.core is not None:
            self.core.close()
        self._delivery.end_all(EngineNotRunningError("the engine was shut down"))
        if self.runner is not None and not self._closed:
            self._closed = True
            self.runner.close()
            gc.unfreeze()  # what start() froze can be collected again

    def drain(self) -> None:
        """Stop admitting work, as on SIGTERM: new requests raise EngineNotRunningError
        and requests that never started end at once with that error; running (and
        preempted) requests go on. Then :meth:`wait_idle` and :meth:`shutdown`."""
        self._draining = True
        core = self.core
        if core is None:
            return
        error = EngineNotRunningError("the server is shutting down")
        never_started = [r for r in core.waiting if r.metrics.first_scheduled_time is None]
        self._delivery.fail(core, never_started, error)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is running or waiting, at most ``timeout`` seconds;
        True when idle."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.core is not None and self.core.has_work and self.is_running:
            assert self.step_loop is not None
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self.step_loop.idle.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.step_loop.idle.wait(), remaining)
        return True

    def _on_loop_done(self, task: asyncio.Task[None]) -> None:
        """A step loop that died (a bug) ends every open stream at once with an error."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        logger.error("the step loop died", exc_info=exc)
        self._delivery.end_all(EngineError(f"the engine stopped: {type(exc).__name__}: {exc}"))

    async def __aenter__(self) -> AsyncEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    @property
    def is_running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    @property
    def is_draining(self) -> bool:
        """True after :meth:`drain`: no new work is admitted."""
        return self._draining

    def _require_core(self) -> EngineCore:
        if self.core is None or not self.is_running:
            raise EngineNotRunningError(
                "the engine is not running (use 'async with AsyncEngine(...)')"
            )
        return self.core

    def encode(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a prompt (see :func:`~aioserve.prompts.encode_prompt`).

        Raises:
            ValueError: the prompt is empty, not text or ids, or an id is out of range.
        """
        vocab_size = self.runner.vocab_size if self.runner is not None else None
        return encode_prompt(prompt, self.tokenizer, vocab_size)

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        meta: RequestMeta | None = None,
        stop_after: int | None = None,
    ) -> RequestStream:
        """Validate and queue a request; returns its stream (see :meth:`generate`).

        ``meta`` (priority, tenant, service-level objectives, free metadata) is what a
        scheduling policy may read of the request besides its tokens. ``stop_after``
        (benchmarks only) ends it with ``stop`` after that many output tokens, as if the
        model had emitted EOS there; no policy sees it (its ``max_tokens`` stays a cap).

        Raises:
            ValueError: bad prompt, ``stop_after`` not an integer >= 1, prompt +
                max_tokens beyond the context length, a
                prompt bigger than the KV cache, or a request_id in use (a request
                that has not ended; an ended one's id may be reused).
            EngineNotRunningError: the engine is not running, or is draining.
            QueueFullError: ``max_waiting`` requests are waiting (the admission limit).
        """
        core = self._require_core()
        if self._draining:
            raise EngineNotRunningError("the server is shutting down")
        params = params if params is not None else SamplingParams()
        if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(
                stop_after, int) or stop_after < 1):
            raise ValueError(f"stop_after must be an integer >= 1, got {stop_after!r}")
        ids = self.encode(prompt)
        if len(ids) + params.max_tokens > core.max_model_len:
            raise ValueError(
                f"max_tokens: prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) "
                f"exceeds the context length of {core.max_model_len} tokens"
            )
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        held = self._delivery.streams.get(request_id)
        if held is not None and not held.closed:  # a closed one ended: its id is free
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = core.clock()
        request = Request(request_id, ids, params, now)
        if meta is not None:
            request.meta = meta
            if meta.deadline is not None:  # Unix time -> the engine's clock
                request.deadline = now + (meta.deadline - time.time())
        core.add(request, stop_after)
        stream = self._delivery.open_stream(request, self.tokenizer)
        assert self.step_loop is not None
        self.step_loop.wakeup.set()
        return stream

    def release(self, stream: RequestStream) -> None:
        """Stop delivering a stream from :meth:`add_request` whose consumer reads
        ``stream.queue`` itself: abort its own request (never another that reused the id)
        if unfinished, and forget the stream. Idempotent; :meth:`generate` does this."""
        self._delivery.release(stream, self.core)

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        meta: RequestMeta | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs, one delta per generated token.

        Leaving the ``async for`` early (break, ``aclose()``, cancellation) aborts the
        request and frees its slot and KV blocks.

        Raises:
            ValueError: invalid input (see :meth:`add_request`), on the first iteration.
            EngineError: a model step failed while this request was in it.
        """
        stream = self.add_request(prompt, params, request_id, meta=meta)
        queue = stream.queue
        items = queue.items
        try:
            while True:
                while not items:  # one wake-up takes every delta queued meanwhile
                    await queue.wait()
                item = items.popleft()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self.release(stream)

    def abort(self, request_id: str) -> None:
        """Abort a request now, freeing its KV blocks; its stream ends with
        ``finish_reason="abort"`` and its id is free at once. Unknown ids are ignored."""
        if self.core is not None and self.core.abort(request_id) is not None:
            self._delivery.flush_finished(self.core)

    def _on_finish(self, request: Request) -> None:
        self._delivery.on_finish(request)
        self.listeners.notify_finish(request)

    def stats(self) -> dict[str, float]:
        """Running and waiting requests, KV usage (0–1), free blocks, preemptions, steps,
        and prefix-cache queried and hit tokens."""
        core = self._require_core()
        return {
            "num_running": len(core.running),
            "num_waiting": len(core.waiting),
            "kv_cache_usage": core.blocks.usage,
            "num_free_blocks": core.blocks.num_free_blocks,
            "num_preemptions": core.num_preemptions,
            "num_steps": core.step_count,
            "prefix_cache_queries": core.prefix_cache_queries,
            "prefix_cache_hits": core.prefix_cache_hits,
        }

    def runner_info(self) -> RunnerInfo:
        """What the runner reports about itself (empty before :meth:`start` loads one)."""
        return self.runner.describe() if self.runner is not None else RunnerInfo()

    def add_step_observer(self, observer: StepObserver) -> None:
        """Call ``observer(feedback)`` as each step ends, in the step loop (it must not
        block). Works before or after :meth:`start`."""
        if observer not in self._step_observers:
            self._step_observers.append(observer)

    def remove_step_observer(self, observer: StepObserver) -> None:
        """Stop calling ``observer``; unknown observers are ignored."""
        if observer in self._step_observers:
            self._step_observers.remove(observer)

    def add_listener(self, listener: EngineListener, *, step_interval: float | None = 0.0) -> None:
        """Call ``listener.on_finish`` for every request that ends and, unless
        ``step_interval`` is None, ``listener.on_step(snapshot)`` after a step at most
        once per ``step_interval`` seconds of the engine clock (0: every step). Both run
        in the step loop: they must not block. Works before or after :meth:`start`.

        Raises:
            ValueError: ``step_interval`` is negative.
        """
        self.listeners.add(listener, step_interval)

    def remove_listener(self, listener: EngineListener) -> None:
        """Stop calling ``listener``; unknown listeners are ignored."""
        self.listeners.remove(listener)

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (e.g. between benchmark runs); running requests go on.

        Raises:
            EngineNotRunningError: the engine is not running.
        """
        self._require_core().blocks.reset_cache()

    def snapshot(self) -> StepSnapshot:
        """The engine's slots, queue and KV cache now (what listeners receive).

        Raises:
            EngineNotRunningError: the engine is not running.
        """
        return self.listeners.snapshot(self._require_core())
