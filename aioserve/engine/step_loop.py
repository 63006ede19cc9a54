"""StepLoop: the engine's background task: schedule, await the step, update, fan out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable

from aioserve.engine.core import EngineCore, StepResult
from aioserve.engine.observation import ListenerHub
from aioserve.engine.output import Delivery
from aioserve.errors import EngineError
from aioserve.request import Request
from aioserve.runners.base import ModelRunner, RunnerOutput, ScheduledBatch

logger = logging.getLogger(__name__)

#: A submitted step: its batch and the runner's future of its output.
StepInFlight = tuple[ScheduledBatch, Awaitable[RunnerOutput]]


class StepLoop:
    """The step loop of one engine. A failure ends only the requests it concerns (a
    failed model step its batch, a faulty policy what it was deciding on); the loop
    goes on. ``wakeup`` is set when work arrives, ``idle`` when there is none."""

    def __init__(
        self, core: EngineCore, runner: ModelRunner, delivery: Delivery, listeners: ListenerHub,
    ) -> None:
        self.core = core
        self.runner = runner
        self.delivery = delivery
        self.listeners = listeners
        self.wakeup = asyncio.Event()
        self.idle = asyncio.Event()

    async def run(self) -> None:
        """The loop; overlapped with a runner that ``overlaps`` (vLLM's async scheduling):
        while step N runs, N+1 is scheduled and submitted, decoding from N's tokens."""
        core = self.core
        overlap = self.runner.overlaps
        in_flight: deque[StepInFlight] = deque()
        while True:
            if not in_flight:
                if not core.has_work:
                    if self.listeners.has_step_listeners:  # the idle picture, unthrottled
                        self.listeners.publish_step(core, 0, force=True)
                    self.runner_idle()
                    self.idle.set()
                    self.wakeup.clear()
                    idle_from = core.clock()
                    await self.wait_for_work()
                    core.idle_s += core.clock() - idle_from
                    self.runner_idle()  # what just arrived has not started
                    continue
                self.start_step(in_flight)
                if not in_flight:
                    await asyncio.sleep(0)
                    continue
            if overlap and len(in_flight) == 1:
                self.start_step(in_flight)  # N+1 goes in while N runs
            batch, future = in_flight.popleft()
            try:
                output = await future
            except Exception as exc:  # the model failed: end this batch, keep serving
                logger.exception("model step failed")
                record = core.oldest_batch_record()
                core.abandon(batch)
                self.fail([row[0] for row in record], exc)
                continue
            record = core.oldest_batch_record()  # no copy: read only if update fails
            try:
                results = core.update(batch, output)
            except Exception as exc:  # a bookkeeping bug: end this batch, keep serving
                logger.exception("step bookkeeping failed")
                self.fail([row[0] for row in record], exc, "step bookkeeping failed")
                continue
            self.fan_out(output, results)
            self.delivery.flush_finished(core)
            if self.listeners.has_step_listeners:
                self.listeners.publish_step(core, len(results))
            if not overlap:
                self.start_step(in_flight)

    async def wait_for_work(self) -> None:
        """Wait for :attr:`wakeup`, at most the runner's ``idle_poll_s`` if it sets one."""
        poll = self.runner.idle_poll_s
        if poll is None:
            await self.wakeup.wait()
            return
        with contextlib.suppress(asyncio.TimeoutError):  # TimeoutError from 3.11 on
            await asyncio.wait_for(self.wakeup.wait(), poll)

    def runner_idle(self) -> None:
        """Tell the runner it is idle; if its arithmetic changed (compiled CPU kernels),
        empty the prefix cache, whose blocks the old arithmetic computed."""
        if self.runner.on_idle():
            self.core.blocks.reset_cache()

    def start_step(self, in_flight: deque[StepInFlight]) -> None:
        """Schedule the next batch and start the runner on it."""
        core = self.core
        if not core.has_work:
            return
        try:
            batch = core.schedule()
        except Exception as exc:  # a faulty policy: end what it was deciding on
            logger.exception("scheduler %r failed", core.scheduler)
            self.fail([*core.running, *core.waiting], exc, "scheduler failed")
            return
        self.delivery.flush_finished(core)  # requests the schedule ended (KV cache too small)
        if batch is None:
            return
        in_flight.append((batch, self.runner.submit(batch)))  # e.g. in a worker thread

    def fan_out(self, output: RunnerOutput, results: list[StepResult]) -> None:
        self.delivery.fan_out(self.core, output, results)

    def fail(self, requests: list[Request], exc: Exception, what: str = "model step failed",
             ) -> None:
        error = EngineError(f"{what}: {type(exc).__name__}: {exc}")
        self.delivery.fail(self.core, requests, error)
