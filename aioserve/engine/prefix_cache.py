"""Automatic prefix caching (vLLM V1's): a waiting request's cached prefix, its first
allocation after it, and the registration of blocks once full of computed tokens."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from aioserve.block_keys import extend_keys
from aioserve.scheduling import NO_HIT, PrefixHit, RequestView

if TYPE_CHECKING:
    from aioserve.kv_cache import BlockManager
    from aioserve.request import Request

__all__ = ["allocate_first_chunk", "cached_prefix", "prefix_hit_lookup", "register_computed"]

def cached_prefix(blocks: BlockManager, request: Request) -> list[int]:
    """The longest cached prefix of a request's tokens in whole blocks, before its last."""
    if not blocks.enable_caching:
        return []
    limit = (request.num_tokens - 1) // blocks.block_size
    keys = extend_keys(request.block_keys, limit, blocks.block_size, request.token_ids_from)
    return blocks.match(keys[:limit])


def register_computed(blocks: BlockManager, request: Request) -> None:
    """Offer the request's blocks now full of confirmed tokens to the cache, each once."""
    full = request.num_confirmed_tokens // blocks.block_size
    done = request.num_registered_blocks
    if full <= done or not blocks.enable_caching:
        return
    keys = extend_keys(request.block_keys, full, blocks.block_size, request.token_ids_from)
    table = request.block_ids
    for index in range(done, full):
        blocks.cache(table[index], keys[index])
    request.num_registered_blocks = full


def prefix_hit_lookup(
    blocks: BlockManager, requests: Mapping[str, Request]
) -> Callable[[RequestView], PrefixHit]:
    """``SchedulerState.prefix_hit`` for one snapshot, memoised while the policy decides."""
    memo: dict[str, PrefixHit] = {}

    def hit(view: RequestView) -> PrefixHit:
        found = memo.get(view.request_id)
        request = requests.get(view.request_id)
        if found is None and request is not None:
            cached = cached_prefix(blocks, request)
            held = len(cached) - blocks.num_unused(cached)
            found = memo[view.request_id] = PrefixHit(len(cached) * blocks.block_size, held)
        return found or NO_HIT

    return hit


def allocate_first_chunk(blocks: BlockManager, request: Request, budget: int) -> int | None:
    """Give a waiting request its cached prefix and new blocks for a first chunk of up
    to ``budget`` tokens; returns the cached tokens, or None (nothing taken) when too
    few blocks are free."""
    cached = cached_prefix(blocks, request)
    start = len(cached) * blocks.block_size
    count = min(request.num_tokens - start, budget)
    new = blocks.blocks_for_tokens(start + count) - len(cached)
    if new + blocks.num_unused(cached) > blocks.num_free_blocks:
        return None
    blocks.share(cached)
    request.block_ids = cached + (blocks.allocate(new) or [])
    request.num_computed_tokens = start
    request.num_registered_blocks = len(cached)
    if request.metrics.first_scheduled_time is None:
        request.num_cached_tokens = start
    return start
