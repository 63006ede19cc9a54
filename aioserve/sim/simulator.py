"""Run a workload through the engine's own step loop, EngineCore, a real scheduler and
the real BlockManager, on a simulated runner's virtual clock.

The step loop is the engine's (:class:`~aioserve.engine.step_loop.StepLoop`), so the
simulator schedules exactly as the engine does. Two timings:

* the article's (default): steps run back to back, one at a time; a step that starts
  at ``t`` ends at ``t + cost``, and every token it samples is stamped with that end
  time. A request's prefill is part of its first step, which also samples its first
  token, so a request of ``n`` output tokens that runs without waiting finishes ``n``
  steps after it starts (what makes the article's figures come out exactly);
* the engine's (``overlap=True``, what a calibrated profile predicts): step N+1 is
  scheduled while step N runs and starts when N ends, as the TorchRunner runs
  (overlapped scheduling), so a request that arrives during step N waits for N+1 to
  end before it is scheduled, and mid-step preemptions fall where the engine's do.

Requests join the queue at the first step boundary at or after their arrival (strictly
after, for ``after_start``); an idle engine jumps its clock to the next arrival.
Latency is finish - arrival.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from aioserve.engine.core import EngineCore
from aioserve.engine.observation import EngineListener, ListenerHub, SnapshotBuilder, scheduler_name
from aioserve.engine.output import Delivery
from aioserve.engine.step_loop import StepInFlight, StepLoop
from aioserve.kv_cache import BlockManager
from aioserve.request import Request
from aioserve.sampling_params import SamplingParams
from aioserve.scheduling import Scheduler, StepFeedback
from aioserve.scheduling.registry import load_scheduler
from aioserve.sim.runner import FIRST_WORD_ID, OverlappedRunner, SimulatedRunner
from aioserve.sim.sim_result import SimConfig, SimResult, SimulationStalled, StepRecord
from aioserve.sim.workloads import WorkloadRequest

__all__ = ["SimConfig", "SimResult", "SimulationStalled", "StepHook", "StepRecord", "simulate"]

#: Called after every step with the engine core and what the step did.
StepHook = Callable[[EngineCore, StepFeedback], None]


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _make_core(
    workload: list[WorkloadRequest], scheduler: Scheduler, config: SimConfig
) -> tuple[EngineCore, SimulatedRunner]:
    longest = max((r.prompt_len + r.limit for r in workload), default=1)
    max_model_len = config.max_model_len or longest
    kv_blocks = config.kv_blocks
    if kv_blocks is None:
        kv_blocks = 2 * config.slots * _blocks(longest, config.block_size)
    # A request ends by a scripted EOS after its output_len tokens; in the engine's
    # timing, one that asks for exactly that many ends by length instead, as it does on
    # the real engine (where it is replayed with ignore_eos).
    scripted = {r.id: r.output_len for r in workload
                if not config.overlap or r.output_len < r.limit}
    kind = OverlappedRunner if config.overlap else SimulatedRunner
    runner = kind(
        scripted,
        step_ms=config.step_ms,
        prefill_ms_per_token=config.prefill_ms_per_token,
        num_kv_blocks=kv_blocks,
        block_size=config.block_size,
        max_model_len=max_model_len,
        cost_model=config.cost_model,
    )
    core = EngineCore(
        scheduler,
        BlockManager(kv_blocks, config.block_size, config.enable_prefix_caching),
        max_num_seqs=config.slots,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_model_len,
        eos_token_ids=runner.eos_token_ids,
        clock=runner.clock,
    )
    return core, runner


def _submit(result: SimResult, item: WorkloadRequest) -> None:
    core = result.core
    kv = core.blocks
    needed = _blocks(item.prompt_len + item.output_len - 1, kv.block_size)
    if needed > kv.num_blocks:
        result.rejected[item.id] = (
            f"needs {needed} KV blocks for {item.prompt_len} prompt + {item.output_len} output "
            f"tokens, but the KV cache holds {kv.num_blocks} blocks "
            f"({kv.num_blocks * kv.block_size} tokens)"
        )
        return
    if item.prompt_len + item.limit > core.max_model_len:  # as AsyncEngine.add_request
        result.rejected[item.id] = (
            f"max_tokens: prompt ({item.prompt_len} tokens) + max_tokens ({item.limit}) "
            f"exceeds the context length of {core.max_model_len} tokens")
        return
    # No oracle: the policy is told a length only when the workload tells one.
    params = SamplingParams(max_tokens=item.limit, temperature=0.0, length_hint=item.length_hint,
                            ignore_eos=result.config.overlap and item.output_len >= item.limit)
    prompt = item.prompt_token_ids(result.runner.vocab_size, FIRST_WORD_ID)
    request = Request(item.id, prompt, params, item.arrival_s)
    request.meta = item.meta(None)
    request.deadline = item.deadline_s
    try:
        core.add(request)
    except ValueError as exc:
        result.rejected[item.id] = str(exc)


class _SimStepLoop(StepLoop):
    """The engine's step loop, stopping on a stall instead of spinning."""

    stalls = 0

    def start_step(self, in_flight: deque[StepInFlight]) -> None:
        before = len(in_flight)
        super().start_step(in_flight)
        if len(in_flight) > before or in_flight or not self.core.has_work:
            self.stalls = 0
            return
        self.stalls += 1
        if self.stalls >= 3:
            raise SimulationStalled(f"no progress at t={self.core.clock()} s")


class _Arrivals:
    """The workload's requests not yet queued, queued as the virtual clock passes them."""

    def __init__(self, result: SimResult) -> None:
        self.result = result
        self.pending = deque(sorted(result.workload, key=lambda r: (r.arrival_ns, r.after_start)))

    def at_boundary(self, now_ns: int) -> None:
        """Queue what arrived before ``now_ns`` (at it, unless ``after_start``)."""
        pending = self.pending
        while pending and (pending[0].arrival_ns < now_ns
                           or (pending[0].arrival_ns == now_ns and not pending[0].after_start)):
            _submit(self.result, pending.popleft())

    def when_idle(self, runner: SimulatedRunner) -> None:
        """Jump an idle engine to the next arrival and queue it (an ``after_start``
        arrival too when nothing else would start then)."""
        runner.advance_to(self.pending[0].arrival_ns)
        now = runner.now_ns
        self.at_boundary(now)
        core = self.result.core
        while not core.has_work and self.pending and self.pending[0].arrival_ns <= now:
            _submit(self.result, self.pending.popleft())


async def simulate(
    workload: list[WorkloadRequest],
    scheduler: str | Scheduler,
    config: SimConfig | None = None,
    on_step: StepHook | None = None,
    listener: EngineListener | None = None,
    scheduler_params: Mapping[str, Any] | None = None,
) -> SimResult:
    """Run ``workload`` to completion under ``scheduler`` on a virtual clock.

    Args:
        workload: the requests (ids unique).
        scheduler: a registered name, ``"package.module:Class"`` or an instance.
        config: the simulated engine (default ``SimConfig()``).
        on_step: called after every step (for invariant checks).
        listener: gets a snapshot after every step and every finished request, as an
            :meth:`AsyncEngine.add_listener` listener does (e.g. ``simulate --html``).
        scheduler_params: the policy's parameters (``--scheduler-config``).

    Raises:
        ValueError: unknown scheduler or bad parameters.
        SimulationStalled: the engine stopped making progress.
    """
    config = config or SimConfig()
    policy = load_scheduler(scheduler, scheduler_params)
    name = scheduler if isinstance(scheduler, str) else scheduler_name(policy)
    core, runner = _make_core(workload, policy, config)
    result = SimResult(name, config, list(workload), core, runner)
    listeners = ListenerHub()
    snapshots = SnapshotBuilder(core) if listener is not None else None
    if listener is not None:
        listeners.add(listener, None)

    def finished(request: Request) -> None:
        result.finished[request.request_id] = request
        listeners.notify_finish(request)

    def stepped(feedback: StepFeedback) -> None:
        result.feedback.append(feedback)
        result.steps.append(StepRecord(feedback.start_time, feedback.end_time,
                                       feedback.request_ids, feedback.num_tokens))
        if on_step is not None:
            on_step(core, feedback)
        if snapshots is not None and listener is not None:
            snapshots.count_tokens(sum(feedback.num_emitted_tokens))
            listener.on_step(snapshots.build())

    core.on_finish = finished
    core.step_observers.append(stepped)
    arrivals = _Arrivals(result)
    runner.on_clock = arrivals.at_boundary
    loop = _SimStepLoop(core, runner, Delivery(), ListenerHub())
    task = asyncio.create_task(loop.run(), name="aioserve-sim-step-loop")
    try:
        while True:
            idle = asyncio.ensure_future(loop.idle.wait())
            await asyncio.wait({idle, task}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                idle.cancel()
                task.result()  # raises what stopped the loop
            if not arrivals.pending:
                break
            loop.idle.clear()
            arrivals.when_idle(runner)
            loop.wakeup.set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return result
