"""StepLoop: the engine's background task, one model step per iteration.

Each iteration takes the oldest step's sampled tokens (``EngineCore.update``), hands
every request its delta (:class:`~aioserve.engine.output.Delivery`), and keeps the runner
busy: with a runner that has ``submit`` (the TorchRunner), step N+1 is scheduled and
submitted while step N runs, its decode inputs being N's sampled tokens still on the
runner's side (vLLM's async scheduling, SGLang's overlap scheduler).
A failure ends only the requests it concerns: a failed model step its batch, a
faulty policy what it was deciding on; the loop goes on.
"""

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
    """The step loop of one engine (run as one asyncio task by ``AsyncEngine``).

    Args:
        core: the engine's state and bookkeeping.
        runner: the model runner.
        delivery: the open output streams.
        listeners: step and finish listeners.

    Attributes:
        wakeup: set when work arrives (the loop waits on it while idle).
        idle: set whenever the loop finds nothing to run.
    """

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
        """The loop, overlapped: while step N runs, N+1 is already scheduled and
        submitted, so the runner never waits for the event loop; then N's tokens are
        taken (``update``), handed out (fan-out) and N+2 is scheduled while N+1 runs. A
        runner without ``submit`` (simulated, scripted) runs one step at a time: its
        ``step`` coroutine is the step, so a virtual clock sees the steps in order."""
        core = self.core
        overlap = hasattr(self.runner, "submit")
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
        """Wait for :attr:`wakeup`, or, for a runner with an ``idle_poll_s`` (not None),
        at most that many seconds (the loop then tells the runner again that it is idle)."""
        poll = getattr(self.runner, "idle_poll_s", None)
        if poll is None:
            await self.wakeup.wait()
            return
        with contextlib.suppress(asyncio.TimeoutError):  # TimeoutError from 3.11 on
            await asyncio.wait_for(self.wakeup.wait(), poll)

    def runner_idle(self) -> None:
        """Tell a runner that has ``on_idle`` that no request has started; when it
        answers that its arithmetic changed (the TorchRunner switching to compiled CPU
        kernels), empty the prefix cache, whose blocks the old arithmetic computed."""
        on_idle = getattr(self.runner, "on_idle", None)
        if on_idle is not None and on_idle():
            self.core.blocks.reset_cache()

    def start_step(self, in_flight: deque[StepInFlight]) -> None:
        """Schedule the next batch and start the runner on it (nothing when there is
        nothing to run)."""
        core = self.core
        if not core.has_work:
            return
        try:
            batch = core.schedule()
        except Exception as exc:  # a faulty policy: end what it was deciding on
            logger.exception("scheduler %r failed", core.scheduler)
            self.fail_all(exc)
            return
        self.delivery.flush_finished(core)  # requests the schedule ended (KV cache too small)
        if batch is None:
            return
        submit = getattr(self.runner, "submit", None)
        if submit is not None:  # starts now, e.g. in the runner's worker thread
            in_flight.append((batch, submit(batch)))
        else:
            in_flight.append((batch, asyncio.ensure_future(self.runner.step(batch))))

    def fan_out(self, output: RunnerOutput, results: list[StepResult]) -> None:
        """Hand every request of a step its token (one pass, see ``Delivery.fan_out``)."""
        self.delivery.fan_out(self.core, output, results)

    def fail_all(self, exc: Exception) -> None:
        """End every running and waiting request with ``exc`` (the policy failed)."""
        core = self.core
        self.fail([*core.running, *core.waiting], exc, "scheduler failed")

    def fail(self, requests: list[Request], exc: Exception, what: str = "model step failed",
             ) -> None:
        """End the given requests with an EngineError saying ``what`` failed."""
        error = EngineError(f"{what}: {type(exc).__name__}: {exc}")
        self.delivery.fail(self.core, requests, error)
