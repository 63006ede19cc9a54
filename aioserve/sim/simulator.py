"""Run a workload through the engine's own step loop, EngineCore, a real scheduler and
the real BlockManager, on a simulated runner's virtual clock.

Two timings (docs/schedulers.md): the article's (steps back to back; a request of ``n``
output tokens that never waits finishes ``n`` steps after it starts) and the engine's
(``overlap=True``: step N+1 scheduled while N runs, as the TorchRunner runs). Requests
join at the first step boundary at or after their arrival (after, for ``after_start``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aioserve.engine.admission import AdmissionLimit, refusal_reason
from aioserve.engine.core import EngineCore
from aioserve.engine.observation import EngineListener, ListenerHub, SnapshotBuilder, scheduler_name
from aioserve.engine.output import Delivery
from aioserve.engine.step_loop import StepInFlight, StepLoop
from aioserve.errors import AdmissionError
from aioserve.kv_cache import BlockManager, blocks_for_tokens
from aioserve.request import Request
from aioserve.sampling_params import SamplingParams
from aioserve.scheduling import Scheduler, StepFeedback
from aioserve.scheduling.registry import load_scheduler
from aioserve.sim.runner import OverlappedRunner, SimulatedRunner
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.request import FIRST_WORD_ID, NS_PER_S, WorkloadRequest

#: The simulated context length when neither the flags nor a profile give one.
DEFAULT_MAX_MODEL_LEN = 2048

__all__ = ["DEFAULT_MAX_MODEL_LEN", "SimConfig", "SimResult", "SimulationStalled", "StepHook",
           "StepRecord", "simulate", "timing_line"]

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
        kv_blocks: None: what every slot needs for a full context (no memory pressure).
        enable_prefix_caching: off by default, so the article's figures stay its model's.
        cost_model: a calibrated step cost; replaces ``step_ms`` and the prefill cost.
        overlap: schedule one step ahead as the engine does (see the module).
        max_model_len: the context length (None: ``DEFAULT_MAX_MODEL_LEN``); a request's
            ``max_tokens`` defaults to what is left of it, never to its true length.
        max_concurrency: most requests in the engine at once (a client's limit, as vLLM
            bench's ``--max-concurrency``): a request arriving at the limit is sent when
            one finishes, and its TTFT counts from then; None: no limit.
        max_waiting, max_queue_time_s: the engine's admission limit (``EngineConfig``'s,
            enforced by the same :class:`~aioserve.engine.admission.AdmissionLimit`): a
            request refused is counted in ``SimResult.rejected`` with its reason
            (``queue_full: ...``, ``queue_timeout: ...``); None: no limit."""

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
    max_concurrency: int | None = None
    max_waiting: int | None = None
    max_queue_time_s: float | None = None


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
        rejected: id -> why, for requests that can never fit or that the admission limit
            refused (the reason first: ``queue_full: ...``).
        feedback: what every step did (the engine's StepFeedback).
        num_preemptions, num_preempted_tokens: overrides of the core's counts (None: its).
        policy: the policy of this run (the core's may have been replaced since).
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
    policy: Scheduler | None = None  # None: the core's

    def __repr__(self) -> str:
        # Short: asyncio.run formats its main task's result (Python 3.11's signal check),
        # and the dataclass repr of every step and request took seconds on a long run.
        return (f"SimResult({self.scheduler!r}, {len(self.finished)} finished, "
                f"{len(self.steps)} steps)")

    @property
    def preemptions(self) -> int:
        return self.core.num_preemptions if self.num_preemptions is None else self.num_preemptions

    @property
    def preempted_tokens(self) -> int:
        if self.num_preempted_tokens is None:
            return self.core.num_preempted_tokens
        return self.num_preempted_tokens


def timing_line(result: SimResult) -> str:
    """What the run's clock charges: flat article timing or a calibrated profile, whether
    prefill and recomputation cost anything, the KV cache and the context length."""
    config, core = result.config, result.core
    blocks = core.blocks.num_blocks
    cache = f"KV cache {blocks} blocks of {core.blocks.block_size} tokens"
    if config.kv_blocks is None and config.cost_model is None:
        cache += " (a full context per slot: no memory pressure)"
    tail = f"{cache}, context {core.max_model_len} tokens, {config.slots} slots"
    if config.cost_model is not None:
        forward = config.cost_model.source.get("forward")
        return (f"timing: calibrated profile (forward {forward}), one step ahead: prefill and "
                f"recomputation cost what they cost where it was calibrated; {tail}")
    prefill = ("free (--prefill-ms-per-token 0)" if config.prefill_ms_per_token == 0
               else f"{config.prefill_ms_per_token:g} ms per token")
    return (f"timing: flat, {config.step_ms:g} ms a step (the article's model, not this "
            f"engine's; --profile for a calibrated one): prefill and recomputation {prefill}; "
            f"{tail}")


def _make_core(
    workload: list[WorkloadRequest], scheduler: Scheduler, config: SimConfig,
    runner_kind: type[SimulatedRunner] | None = None,
) -> tuple[EngineCore, SimulatedRunner]:
    max_model_len = config.max_model_len or DEFAULT_MAX_MODEL_LEN
    kv_blocks = config.kv_blocks
    if kv_blocks is None:
        kv_blocks = config.slots * blocks_for_tokens(max_model_len, config.block_size)
    # The hidden stop: a request ends by a scripted EOS after its output_len tokens, which
    # neither its max_tokens (a cap) nor its view tells the policy. In the engine's timing
    # one whose cap is exactly that many ends by length instead, as on the real engine.
    scripted = {r.id: r.output_len for r in workload
                if not config.overlap or r.output_len < r.cap(max_model_len)}
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
        admission=AdmissionLimit(config.max_waiting, config.max_queue_time_s),
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
    cap = item.cap(core.max_model_len)
    if item.prompt_len + max(cap, item.output_len) > core.max_model_len:  # as add_request
        result.rejected[item.id] = (
            f"max_tokens: prompt ({item.prompt_len} tokens) + max_tokens ({cap}, output_len "
            f"{item.output_len}) exceeds the context length of {core.max_model_len} tokens")
        return
    # No oracle: the policy is told a length only when the workload tells one.
    params = SamplingParams(max_tokens=cap, temperature=0.0, length_hint=item.length_hint)
    if prompt is None:
        prompt = item.prompt_token_ids(result.runner.vocab_size, FIRST_WORD_ID)
    request = Request(item.id, prompt, params, item.arrival_s)
    request.meta = item.meta_from()
    request.deadline = item.deadline_s
    try:
        core.add(request)
    except ValueError as exc:
        result.rejected[item.id] = str(exc)
    except AdmissionError as exc:  # the waiting queue is full
        result.rejected[item.id] = refusal_reason(exc)


def load_policy(scheduler: str | Scheduler, scheduler_params: Mapping[str, Any] | None,
                workload: Sequence[WorkloadRequest]) -> tuple[Scheduler, str]:
    """The run's policy and its label (its ``name``, as the server labels it); the
    ``oracle`` predictor is handed the workload's true lengths (the oracle is the
    workload's, never a request's) and the label says it is an upper bound."""
    if scheduler_params is None or scheduler_params.get("predictor") != "oracle":
        policy = load_scheduler(scheduler, scheduler_params)
        return policy, scheduler_name(policy)
    config = dict(scheduler_params.get("predictor_config") or {})
    config["lengths"] = {w.id: w.output_len for w in workload}
    policy = load_scheduler(scheduler, {**scheduler_params, "predictor_config": config})
    return policy, scheduler_name(policy) + " (oracle: upper bound)"


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
        self.limit = result.config.max_concurrency
        self.position = {r.id: i for i, r in enumerate(result.workload)}
        self.sent = 0
        self.held = False  # a request waited for the concurrency limit at the last boundary
        self.prompts: dict[str, list[int]] = {}

    def submit(self, item: WorkloadRequest) -> None:
        self.sent += 1
        _submit(self.result, item, self.prompts.pop(item.id, None))

    def _room(self) -> bool:
        result = self.result
        return self.limit is None or (
            self.sent - len(result.finished) - len(result.rejected) < self.limit)

    def at_boundary(self, now_ns: int) -> None:
        pending = self.pending
        while pending and precedes(pending[0], now_ns):
            if not self._room():
                self.held = True
                return
            item = pending.popleft()
            if self.held and item.arrival_ns < now_ns:  # sent when a request finished, now
                item = replace(item, arrival_s=now_ns / NS_PER_S)
                self.result.workload[self.position[item.id]] = item
            self.submit(item)
        self.held = False

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
        core.close()  # the policy saves what it learnt (a predictor's state_path)
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
    policy, name = load_policy(scheduler, scheduler_params, workload)
    core, runner = _make_core(workload, policy, config, runner_kind)
    result = SimResult(name, config, list(workload), core, runner, policy=policy)
    listeners = ListenerHub()
    snapshots = SnapshotBuilder(core) if listener is not None else None
    if listener is not None:
        listeners.add(listener, None)

    def finished(request: Request) -> None:
        if request.refusal is not None:  # ended by max_queue_time_s before it was scheduled
            result.rejected[request.request_id] = refusal_reason(request.refusal)
        else:
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
