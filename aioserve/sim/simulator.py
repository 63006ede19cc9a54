"""Run a workload through the engine's own step loop, EngineCore, a real scheduler and
the real BlockManager, on a simulated runner's virtual clock.

Two timings (docs/schedulers.md): the article's (steps back to back; a request of ``n``
output tokens that never waits finishes ``n`` steps after it starts) and the engine's
(``overlap=True``: step N+1 scheduled while N runs, as the TorchRunner runs). Requests
join at the first step boundary at or after their arrival (after, for ``after_start``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aioserve.engine.core import EngineCore
from aioserve.engine.observation import EngineListener, ListenerHub, SnapshotBuilder, scheduler_name
from aioserve.engine.output import Delivery
from aioserve.engine.step_loop import StepInFlight, StepLoop
from aioserve.kv_cache import BlockManager, blocks_for_tokens
from aioserve.request import Request
from aioserve.sampling_params import SamplingParams
from aioserve.scheduling import Scheduler, StepFeedback
from aioserve.scheduling.registry import load_scheduler
from aioserve.sim.runner import FIRST_WORD_ID, OverlappedRunner, SimulatedRunner
from aioserve.sim.step_cost import StepCostModel
from aioserve.sim.workloads import WorkloadRequest

__all__ = ["SimConfig", "SimResult", "SimulationStalled", "StepHook", "StepRecord", "simulate"]

#: Called after every step with the engine core and what the step did.
StepHook = Callable[[EngineCore, StepFeedback], None]


class SimulationStalled(RuntimeError):
    """The engine had work but scheduled nothing three times in a row (a deadlock)."""


@dataclass(frozen=True)
class SimConfig:
    """The simulated engine (times in ms, sizes in tokens and blocks).

    Attributes:
        slots: ``max_num_seqs``.
        step_ms, prefill_ms_per_token: the article's step cost (50, 0).
        kv_blocks: None: twice what every slot needs for the longest request.
        enable_prefix_caching: off by default, so the article's figures stay its model's.
        cost_model: a calibrated step cost; replaces ``step_ms`` and the prefill cost.
        overlap: schedule one step ahead as the engine does (see the module).
        max_model_len: None: the workload's longest request."""

    slots: int = 4
    step_ms: float = 50.0
    prefill_ms_per_token: float = 0.0
    kv_blocks: int | None = None
    block_size: int = 16
    max_num_batched_tokens: int = 4096
    enable_prefix_caching: bool = False
    cost_model: StepCostModel | None = None
    overlap: bool = False
    max_model_len: int | None = None


@dataclass(frozen=True)
class StepRecord:
    """One step: start and end in seconds, the requests it ran, tokens fed."""

    start_s: float
    end_s: float
    request_ids: tuple[str, ...]
    num_tokens: int


@dataclass
class SimResult:
    """What a simulation produced (times in seconds on the virtual clock).

    Attributes:
        finished: engine requests that ended, by id (tokens and metrics inside).
        rejected: id -> why, for requests that can never fit.
        feedback: what every step did (the engine's StepFeedback).
        num_preemptions, num_preempted_tokens: overrides of the core's counts (None: its).
        core, runner: the engine core and simulated runner at the end."""

    scheduler: str
    config: SimConfig
    workload: list[WorkloadRequest]
    core: EngineCore
    runner: SimulatedRunner
    finished: dict[str, Request] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    feedback: list[StepFeedback] = field(default_factory=list)
    num_preemptions: int | None = None
    num_preempted_tokens: int | None = None

    @property
    def preemptions(self) -> int:
        return self.core.num_preemptions if self.num_preemptions is None else self.num_preemptions

    @property
    def preempted_tokens(self) -> int:
        if self.num_preempted_tokens is None:
            return self.core.num_preempted_tokens
        return self.num_preempted_tokens


def _make_core(
    workload: list[WorkloadRequest], scheduler: Scheduler, config: SimConfig,
    runner_kind: type[SimulatedRunner] | None = None,
) -> tuple[EngineCore, SimulatedRunner]:
    longest = max((r.prompt_len + r.limit for r in workload), default=1)
    max_model_len = config.max_model_len or longest
    kv_blocks = config.kv_blocks
    if kv_blocks is None:
        kv_blocks = 2 * config.slots * blocks_for_tokens(longest, config.block_size)
    # A request ends by a scripted EOS after its output_len tokens; in the engine's
    # timing, one that asks for exactly that many ends by length instead, as it does on
    # the real engine (where it is replayed with ignore_eos).
    scripted = {r.id: r.output_len for r in workload
                if not config.overlap or r.output_len < r.limit}
    kind = runner_kind or (OverlappedRunner if config.overlap else SimulatedRunner)
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


def _submit(result: SimResult, item: WorkloadRequest, prompt: list[int] | None = None) -> None:
    core = result.core
    kv = core.blocks
    needed = blocks_for_tokens(item.prompt_len + item.output_len - 1, kv.block_size)
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
    if prompt is None:
        prompt = item.prompt_token_ids(result.runner.vocab_size, FIRST_WORD_ID)
    request = Request(item.id, prompt, params, item.arrival_s)
    request.meta = item.meta
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
    """The workload's requests not yet queued, queued as the virtual clock passes them
    (``prompts``: token ids already made, by request id)."""

    def __init__(self, result: SimResult) -> None:
        self.result = result
        self.pending = deque(sorted(result.workload, key=lambda r: (r.arrival_ns, r.after_start)))
        self.prompts: dict[str, list[int]] = {}

    def submit(self, item: WorkloadRequest) -> None:
        _submit(self.result, item, self.prompts.pop(item.id, None))

    def at_boundary(self, now_ns: int) -> None:
        pending = self.pending
        while pending and precedes(pending[0], now_ns):
            self.submit(pending.popleft())

    def when_idle(self, runner: SimulatedRunner) -> None:
        """Jump an idle engine to the next arrival and queue it."""
        runner.advance_to(self.pending[0].arrival_ns)
        now = runner.now_ns
        self.at_boundary(now)
        core = self.result.core
        while not core.has_work and self.pending and self.pending[0].arrival_ns <= now:
            self.submit(self.pending.popleft())


def precedes(item: WorkloadRequest, boundary_ns: int) -> bool:
    """Whether a request arriving joins at a step boundary at ``boundary_ns`` (or earlier)."""
    return item.arrival_ns < boundary_ns or (item.arrival_ns == boundary_ns
                                             and not item.after_start)


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
        listener: gets a snapshot after every step and finished request (``--html``).
        scheduler_params: the policy's parameters (``--scheduler-config``).

    Raises:
        ValueError: unknown scheduler or bad parameters.
        SimulationStalled: the engine stopped making progress."""
    result = _replica(workload, scheduler, config or SimConfig(), on_step, listener,
                      scheduler_params)
    core, runner = result.core, result.runner
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


def _replica(
    workload: list[WorkloadRequest],
    scheduler: str | Scheduler,
    config: SimConfig,
    on_step: StepHook | None,
    listener: EngineListener | None,
    scheduler_params: Mapping[str, Any] | None,
    runner_kind: type[SimulatedRunner] | None = None,
) -> SimResult:
    """One simulated engine sized for ``workload``, its result filled as it runs."""
    policy = load_scheduler(scheduler, scheduler_params)
    name = scheduler if isinstance(scheduler, str) else scheduler_name(policy)
    core, runner = _make_core(workload, policy, config, runner_kind)
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
    return result
