"""The simulator's configuration and results: :class:`SimConfig` (the simulated engine:
slots, KV blocks, budgets, step cost), :class:`StepRecord` (one step) and
:class:`SimResult` (what a run produced, with the engine core at its end).

Times are seconds on the simulator's virtual clock; token counts are tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aioserve.request import Request
from aioserve.scheduling import StepFeedback
from aioserve.sim.step_cost import StepCostModel
from aioserve.sim.workloads import WorkloadRequest

if TYPE_CHECKING:
    from aioserve.engine.core import EngineCore
    from aioserve.sim.runner import SimulatedRunner


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
        cost_model: a calibrated step cost (``aioserve simulate --calibrate``); it
            replaces ``step_ms`` and ``prefill_ms_per_token``.
        overlap: schedule one step ahead as the engine does (see the module); a
            request whose ``max_tokens`` equals its output length then ends by length,
            as on the real engine, instead of by a scripted EOS.
        max_model_len: context length in tokens (None: the workload's longest request).
    """

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
        feedback: what every step did (the engine's :class:`StepFeedback`).
        num_preemptions: preemptions in this run (None: the core's count).
        num_preempted_tokens: computed tokens preemptions dropped (recomputed later).
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
    feedback: list[StepFeedback] = field(default_factory=list)
    num_preemptions: int | None = None
    num_preempted_tokens: int | None = None

    @property
    def preemptions(self) -> int:
        """Preemptions the engine counted over the run."""
        return self.core.num_preemptions if self.num_preemptions is None else self.num_preemptions

    @property
    def preempted_tokens(self) -> int:
        """Computed tokens preemptions dropped (each recomputed on readmission)."""
        if self.num_preempted_tokens is None:
            return self.core.num_preempted_tokens
        return self.num_preempted_tokens
