"""The scheduler plugin contract: a read-only view of the engine in, a decision out.

A policy decides; the engine owns every queue and block and checks each decision
(unknown ids are ignored, budgets and KV blocks are enforced), so a faulty policy
cannot corrupt state. See ``docs/schedulers.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Protocol

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
    def num_output_placeholders(self) -> int: ...
    @property
    def block_ids(self) -> Sequence[int]: ...


class PrefixHit(NamedTuple):
    """The cached prefix a waiting request would start from (prefix caching).

    Attributes:
        num_tokens: its leading tokens whose KV blocks are cached (a multiple of the
            block size, always less than its ``num_tokens``: the last token is computed).
        num_held_blocks: of those blocks, the ones running requests hold; they cost no
            free block (the others are counted in ``num_free_blocks``).
    """

    num_tokens: int
    num_held_blocks: int


NO_HIT = PrefixHit(0, 0)


def _no_hit(request: RequestView) -> PrefixHit:
    return NO_HIT


@dataclass(frozen=True)
class SchedulerState:
    """The engine as a policy sees it before a step.

    Attributes:
        waiting: requests not running, in queue order (preempted ones first, then
            arrival order).
        running: requests holding a slot, in admission order (oldest first).
        num_free_blocks: KV-cache blocks an allocation may take (free, or cached and
            held by no request: those are evicted, least recently used first).
        num_total_blocks: all KV-cache blocks.
        block_size: tokens per block.
        max_num_seqs: slots.
        max_num_batched_tokens: token budget of one step.
        now: current time in seconds (monotonic, or the simulator's virtual clock).
        step: number of steps run so far.
        prefix_hit: a waiting request's cached prefix (engine-provided, computed on
            first use and memoised for this snapshot); read it through
            :meth:`cached_tokens`, :meth:`tokens_to_compute` and :meth:`blocks_needed`.
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
    prefix_hit: Callable[[RequestView], PrefixHit] = _no_hit

    def _hit(self, request: RequestView) -> PrefixHit:
        # Only a waiting request (no blocks yet) can start from the prefix cache.
        return self.prefix_hit(request) if not request.block_ids else NO_HIT

    def cached_tokens(self, request: RequestView) -> int:
        """Tokens of a waiting request that the prefix cache already holds, so its
        admission skips them (0 for a running request or without prefix caching)."""
        return self._hit(request).num_tokens

    def tokens_to_compute(self, request: RequestView) -> int:
        """Tokens the request still has to feed through the model (prefill or recompute
        left, less its cached prefix when waiting; 1 while decoding). A token still being
        sampled by the step in flight counts as part of the request."""
        total = request.num_tokens + request.num_output_placeholders
        return total - request.num_computed_tokens - self._hit(request).num_tokens

    def running_demand(self) -> tuple[int, int]:
        """(tokens, free blocks) the running requests take to compute all their
        remaining tokens in the next step: the sums of :meth:`tokens_to_compute` and of
        :meth:`blocks_needed` over ``running``, in one pass (the per-step hot path of a
        policy at hundreds of running requests)."""
        size = self.block_size
        tokens = blocks = 0
        for request in self.running:
            total = request.num_tokens + request.num_output_placeholders
            tokens += total - request.num_computed_tokens
            grow = -(-total // size) - len(request.block_ids)
            if grow > 0:
                blocks += grow
        return tokens, blocks

    def blocks_needed(self, request: RequestView, num_new_tokens: int) -> int:
        """Free blocks the request takes before ``num_new_tokens`` more of its tokens
        (after its cached prefix, when waiting) can be computed (0 when its blocks
        already hold them). Cached blocks no request holds count: sharing them takes
        them out of ``num_free_blocks``."""
        cached, held = self._hit(request)
        total = request.num_computed_tokens + cached + num_new_tokens
        return max(0, -(-total // self.block_size) - len(request.block_ids) - held)


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
