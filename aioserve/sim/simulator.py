"""Run a workload through the real EngineCore, a real scheduler and the real
BlockManager on a SimulatedRunner's virtual clock.

Timing (the article's, and what makes its figures come out exactly): steps run back
to back; a step that starts at ``t`` ends at ``t + cost``, and every token it samples
is stamped with that end time. A request's prefill is part of its first step, which
also samples its first token, so a request of ``n`` output tokens that runs without
waiting finishes ``n`` steps after it starts. Requests join the queue at the first
step boundary at or after their arrival (strictly after, for ``after_start``); an
idle engine jumps its clock to the next arrival. Latency is finish − arrival.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from aioserve.engine_core import EngineCore
from aioserve.kv_cache import BlockManager
from aioserve.request import Request
from aioserve.runners.base import ScheduledBatch
from aioserve.sampling_params import SamplingParams
from aioserve.scheduler_registry import load_scheduler
from aioserve.scheduling import Scheduler
from aioserve.sim.runner import FIRST_WORD_ID, NS_PER_S, SimulatedRunner
from aioserve.sim.workloads import WorkloadRequest
from aioserve.step_snapshot import EngineListener, SnapshotBuilder

#: Called after every step with the engine core and the batch it ran.
StepHook = Callable[[EngineCore, ScheduledBatch], None]


class SimulationStalled(RuntimeError):
    """The engine had work but scheduled nothing three times in a row (a deadlock)."""


@dataclass(frozen=True)
class SimConfig:
    """The simulated engine.

    Attributes:
        slots: most requests running at once (``max_num_seqs``).
        step_ms: cost of a step in milliseconds (the article's 50).
        prefill_ms_per_token: extra cost per prompt or recomputed token (default 0).
        kv_blocks: KV-cache blocks; None means unlimited: twice what every slot holding
            the workload's largest request needs, so memory never limits.
        block_size: tokens per KV block.
        max_num_batched_tokens: token budget of one step.
        enable_prefix_caching: share the KV blocks of prompt prefixes already computed
            (off by default, so the article's figures stay those of its model); the
            prefill cost is then paid only for uncached tokens.
    """

    slots: int = 4
    step_ms: float = 50.0
    prefill_ms_per_token: float = 0.0
    kv_blocks: int | None = None
    block_size: int = 16
    max_num_batched_tokens: int = 4096
    enable_prefix_caching: bool = False


@dataclass(frozen=True)
class StepRecord:
    """One step: its start and end in seconds, the requests it ran, tokens fed."""

    start_s: float
    end_s: float
    request_ids: tuple[str, ...]
    num_tokens: int


@dataclass
class SimResult:
    """What a simulation produced.

    Attributes:
        scheduler: the policy's name (or the spec it was loaded from).
        config: the simulated engine.
        workload: the requests, as given.
        finished: engine requests that ended, by id (tokens and metrics inside).
        rejected: id -> why, for requests that can never fit the KV cache.
        steps: every step run, in order.
        preemptions: preemptions the engine counted.
        core: the engine core at the end (for integrity checks).
        runner: the simulated runner (its clock, step count and tokens).
    """

    scheduler: str
    config: SimConfig
    workload: list[WorkloadRequest]
    core: EngineCore
    runner: SimulatedRunner
    finished: dict[str, Request] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def preemptions(self) -> int:
        """Preemptions the engine counted over the whole run."""
        return self.core.num_preemptions


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _make_core(
    workload: list[WorkloadRequest], scheduler: Scheduler, config: SimConfig
) -> tuple[EngineCore, SimulatedRunner]:
    longest = max((r.prompt_len + r.output_len for r in workload), default=1)
    kv_blocks = config.kv_blocks
    if kv_blocks is None:
        kv_blocks = 2 * config.slots * _blocks(longest, config.block_size)
    runner = SimulatedRunner(
        {r.id: r.output_len for r in workload},
        step_ms=config.step_ms,
        prefill_ms_per_token=config.prefill_ms_per_token,
        num_kv_blocks=kv_blocks,
        block_size=config.block_size,
        max_model_len=longest,
    )
    core = EngineCore(
        scheduler,
        BlockManager(kv_blocks, config.block_size, config.enable_prefix_caching),
        max_num_seqs=config.slots,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=longest,
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
    hint = item.length_hint if item.length_hint is not None else item.output_len
    params = SamplingParams(max_tokens=item.output_len, temperature=0.0, length_hint=hint)
    prompt = item.prompt_token_ids(result.runner.vocab_size, FIRST_WORD_ID)
    request = Request(item.id, prompt, params, item.arrival_s)
    try:
        core.add(request)
    except ValueError as exc:
        result.rejected[item.id] = str(exc)


async def simulate(
    workload: list[WorkloadRequest],
    scheduler: str | Scheduler,
    config: SimConfig | None = None,
    on_step: StepHook | None = None,
    listener: EngineListener | None = None,
) -> SimResult:
    """Run ``workload`` to completion under ``scheduler`` on a virtual clock.

    Args:
        workload: the requests (ids unique).
        scheduler: a registered name, ``"package.module:Class"`` or an instance.
        config: the simulated engine (default ``SimConfig()``).
        on_step: called after every step (for invariant checks).
        listener: gets a snapshot after every step and every finished request, as an
            :meth:`AsyncEngine.add_listener` listener does (e.g. ``simulate --html``).

    Raises:
        ValueError: unknown scheduler.
        SimulationStalled: the engine stopped making progress.
    """
    config = config or SimConfig()
    policy = load_scheduler(scheduler)
    name = scheduler if isinstance(scheduler, str) else (policy.name or type(policy).__name__)
    core, runner = _make_core(workload, policy, config)
    result = SimResult(name, config, list(workload), core, runner)
    snapshots = SnapshotBuilder(core) if listener is not None else None

    def finished(request: Request) -> None:
        result.finished[request.request_id] = request
        if listener is not None:
            listener.on_finish(request)

    core.on_finish = finished
    pending = deque(sorted(workload, key=lambda r: (r.arrival_ns, r.after_start)))
    stalls = 0
    while pending or core.has_work:
        if not core.has_work:
            runner.advance_to(pending[0].arrival_ns)
        now = runner.now_ns
        while pending and (
            pending[0].arrival_ns < now
            or (pending[0].arrival_ns == now and not pending[0].after_start)
        ):
            _submit(result, pending.popleft())
        if not core.has_work:  # no step starts now: ``after_start`` ones arrive to an idle engine
            while pending and pending[0].arrival_ns <= now:
                _submit(result, pending.popleft())
            continue
        start = runner.now_ns
        batch = core.schedule()
        if batch is None:
            stalls += 1
            if stalls >= 3:
                raise SimulationStalled(f"{name}: no progress at t={start / NS_PER_S} s")
            continue
        stalls = 0
        output = await runner.step(batch)
        sampled = core.update(batch, output)
        result.steps.append(
            StepRecord(start / NS_PER_S, runner.clock(), tuple(batch.request_ids), batch.num_tokens)
        )
        if on_step is not None:
            on_step(core, batch)
        if snapshots is not None and listener is not None:
            snapshots.count_tokens(len(sampled))
            listener.on_step(snapshots.build())
    return result
