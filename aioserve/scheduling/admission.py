"""Admission: the budget of one decision (slots, step tokens, free KV blocks), shared
by every policy so that a policy that only orders requests is a sort key and nothing
else. The arithmetic is the engine's own: the engine admits what this admits."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from aioserve.scheduling.view import RequestView

if TYPE_CHECKING:
    from aioserve.scheduling.state import SchedulerState


class Admission:
    """Slots, tokens and free blocks left for waiting requests in this step.

    Made by :meth:`SchedulerState.admission`. :meth:`fits` asks, :meth:`admit` takes,
    :meth:`fill` does both in an order until the first request that does not fit (as
    vLLM and SGLang admit: a large request is not overtaken forever).

    Attributes:
        slots: free slots left.
        budget: step tokens left (prefill chunks count their tokens).
        free_blocks: KV blocks left (after the running requests' growth).
        admitted: request ids admitted so far, in order.
    """

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
