"""The scheduler plugin contract: a read-only view of the engine in, a decision out.

A policy decides; the engine owns every queue and block and checks each decision
(unknown ids are ignored, budgets and KV blocks are enforced), so a faulty policy
cannot corrupt state. See ``docs/schedulers.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from aioserve.sampling_params import SamplingParams


class RequestView(Protocol):
    """What a policy may read of a request (never write)."""

    @property
    def request_id(self) -> str: ...
    @property
    def arrival_time(self) -> float: ...
    @property
    def params(self) -> SamplingParams: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def block_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class SchedulerState:
    """The engine as a policy sees it before a step.

    Attributes:
        waiting: requests not running, in queue order (preempted ones first, then
            arrival order).
        running: requests holding a slot, in admission order (oldest first).
        num_free_blocks: free KV-cache blocks.
        num_total_blocks: all KV-cache blocks.
        block_size: tokens per block.
        max_num_seqs: slots.
        max_num_batched_tokens: token budget of one step.
        now: current time in seconds (monotonic, or the simulator's virtual clock).
        step: number of steps run so far.
    """

    waiting: Sequence[RequestView]
    running: Sequence[RequestView]
    num_free_blocks: int
    num_total_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    now: float
    step: int

    def tokens_to_compute(self, request: RequestView) -> int:
        """Tokens the request still has to feed through the model (prefill or recompute
        left, or 1 while decoding)."""
        return request.num_tokens - request.num_computed_tokens

    def blocks_needed(self, request: RequestView, num_new_tokens: int) -> int:
        """Blocks the request must be given before ``num_new_tokens`` more of its
        tokens can be computed (0 when its blocks already hold them)."""
        total = request.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(request.block_ids))


@dataclass(frozen=True)
class SchedulerOutput:
    """A policy's decision for one step.

    Attributes:
        admit: waiting request ids to start, in order; the engine admits them while
            slots, the token budget and KV blocks allow, and stops at the first that
            does not fit.
        preempt: running request ids to evict; their blocks are freed and they are
            recomputed later (their generated tokens are kept).
    """

    admit: Sequence[str] = ()
    preempt: Sequence[str] = ()


class Scheduler:
    """Base class of scheduling policies. Subclasses set ``name`` and ``schedule``."""

    name: ClassVar[str] = ""

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        """Decide which waiting requests to admit and which running ones to preempt."""
        raise NotImplementedError

    def on_arrival(self, request: RequestView) -> None:
        """Called when a request joins the waiting queue (hook; default does nothing)."""

    def on_finish(self, request: RequestView) -> None:
        """Called when a request finishes, for any reason (hook; default does nothing)."""
