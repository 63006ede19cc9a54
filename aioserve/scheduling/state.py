"""SchedulerState and Admission: the engine before a step, and the slot, token and KV-block
arithmetic every policy shares (the engine's own)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from aioserve.kv_cache import blocks_for_tokens
from aioserve.scheduling.view import RequestView

if TYPE_CHECKING:
    from aioserve.request import Request


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


def _raw_demand(requests: Sequence[Request], size: int) -> tuple[int, int]:
    tokens = blocks = 0
    for r in requests:
        total = len(r.prompt_token_ids) + len(r.output_token_ids) + r.num_output_placeholders
        tokens += total - r.num_computed_tokens
        grow = blocks_for_tokens(total, size) - len(r.block_ids)
        if grow > 0:
            blocks += grow
    return tokens, blocks


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
        running_requests: the engine's own objects behind ``running`` (engine-provided,
            for the helpers' arithmetic only; policies read the views).
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
    running_requests: Sequence[Request] = field(default=(), repr=False, compare=False)
    _demand: list[tuple[int, int]] = field(default_factory=list, init=False, repr=False,
                                           compare=False)

    def _hit(self, request: RequestView) -> PrefixHit:
        # Only a waiting request (no blocks yet) can start from the prefix cache.
        return self.prefix_hit(request) if not request.num_blocks else NO_HIT

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

    def running_demand(self, excluding: Collection[str] = ()) -> tuple[int, int]:
        """(tokens, free blocks) the running requests, less ``excluding`` (e.g. paused ones), take
        to compute their remaining tokens in the next step; memoised when nothing is excluded."""
        if not excluding and self._demand:
            return self._demand[0]
        if self.running_requests and not excluding:
            self._demand.append(_raw_demand(self.running_requests, self.block_size))
            return self._demand[0]
        size = self.block_size
        tokens = blocks = 0
        for request in self.running:
            if excluding and request.request_id in excluding:
                continue
            total = request.num_tokens + request.num_output_placeholders
            tokens += total - request.num_computed_tokens
            grow = blocks_for_tokens(total, size) - request.num_blocks
            if grow > 0:
                blocks += grow
        if not excluding:
            self._demand.append((tokens, blocks))
        return tokens, blocks

    def blocks_needed(self, request: RequestView, num_new_tokens: int) -> int:
        """Free blocks the request takes before ``num_new_tokens`` more of its tokens
        (after its cached prefix, when waiting) can be computed (0 when its blocks
        already hold them). Cached blocks no request holds count: sharing them takes
        them out of ``num_free_blocks``."""
        cached, held = self._hit(request)
        total = request.num_computed_tokens + cached + num_new_tokens
        return max(0, blocks_for_tokens(total, self.block_size) - request.num_blocks - held)

    def admission(self, paused: Collection[str] = ()) -> Admission:
        """A fresh :class:`Admission`: the slots, step tokens and free blocks left once the
        running requests (less ``paused``) take theirs."""
        tokens, blocks = self.running_demand(paused)
        return Admission(self, self.max_num_seqs - len(self.running),
                         self.max_num_batched_tokens - tokens, self.num_free_blocks - blocks)

    def preempt_for_growth(self, victims: Iterable[RequestView]) -> list[str]:
        """Running request ids to evict, taken from ``victims`` in order (e.g. a policy's
        ``victims(state)``), until the others have the free blocks to compute their next
        tokens; at least one keeps running. Empty when nothing must go (the common case)."""
        tokens, need = self.running_demand()
        free = self.num_free_blocks
        if need <= free:
            return []
        left = len(self.running)
        chosen: list[str] = []
        for victim in victims:
            if need <= free or left <= 1:
                break
            chosen.append(victim.request_id)
            free += victim.num_blocks
            need -= self.blocks_needed(victim, self.tokens_to_compute(victim))
            left -= 1
        return chosen


class Admission:
    """The budget of one decision: slots, step tokens and free KV blocks left for waiting
    requests. Made by :meth:`SchedulerState.admission`; :meth:`fits` asks, :meth:`admit`
    takes, :meth:`fill` admits in order until the first request that does not fit (as vLLM
    and SGLang admit: a large request is not overtaken forever). ``admitted`` lists the ids
    admitted so far; ``budget`` counts tokens."""

    __slots__ = ("state", "slots", "budget", "free_blocks", "admitted", "_busy")

    def __init__(self, state: SchedulerState, slots: int, budget: int, free_blocks: int) -> None:
        self.state = state
        self.slots = slots
        self.budget = budget
        self.free_blocks = free_blocks
        self.admitted: list[str] = []
        self._busy = bool(state.running)

    def cost(self, request: RequestView, max_tokens: int | None = None) -> tuple[int, int]:
        """(tokens, blocks) the request's first chunk takes now: its tokens to compute,
        at most the budget left and ``max_tokens``, and the free blocks they need."""
        chunk = min(self.state.tokens_to_compute(request), self.budget)
        if max_tokens is not None:
            chunk = min(chunk, max(max_tokens, 1))
        return chunk, self.state.blocks_needed(request, chunk)

    def fits(self, request: RequestView, keep_free: int = 0,
             max_tokens: int | None = None) -> bool:
        """Whether the request can start now: a slot, some token budget and the blocks
        of its first chunk, leaving ``keep_free`` blocks (a watermark; ignored while
        nothing runs, so an idle engine always takes a request that fits at all)."""
        if self.slots <= 0 or self.budget <= 0:
            return False
        _, blocks = self.cost(request, max_tokens)
        if self._busy and self.free_blocks - blocks < keep_free:
            return False
        return blocks <= self.free_blocks

    def admit(self, request: RequestView, max_tokens: int | None = None) -> None:
        """Take the request's slot, tokens and blocks from the budget (check
        :meth:`fits` first)."""
        chunk, blocks = self.cost(request, max_tokens)
        self.admitted.append(request.request_id)
        self.slots -= 1
        self.budget -= chunk
        self.free_blocks -= blocks

    def release(self, request: RequestView) -> None:
        """Credit back a running request this decision preempts: its slot, its tokens
        of this step and its blocks (held, and those it needed to grow)."""
        tokens = self.state.tokens_to_compute(request)
        self.slots += 1
        self.budget += tokens
        self.free_blocks += request.num_blocks + self.state.blocks_needed(request, tokens)

    def fill(self, order: Iterable[RequestView], keep_free: int = 0) -> list[str]:
        """Admit requests in ``order`` until the first that does not fit; returns every
        id admitted so far."""
        for request in order:
            if not self.fits(request, keep_free):
                break
            self.admit(request)
        return self.admitted
