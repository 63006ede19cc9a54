"""Block keys of automatic prefix caching (vLLM V1's ``KVCacheManager`` block hashes):
a full block is named by its tokens and everything before them, a hash chained over
its parent's key plus its own token ids
(:mod:`~aioserve.engine.prefix_cache` looks them up)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["ROOT_HASH", "BlockKey", "block_key", "extend_keys"]

#: A full block's key: (hash chained over every block up to this one, its token ids).
BlockKey = tuple[int, tuple[int, ...]]

#: Parent hash of a request's first block.
ROOT_HASH = 0


def block_key(parent: BlockKey | None, tokens: Sequence[int]) -> BlockKey:
    """The key of a full block of ``tokens`` whose predecessor has key ``parent``
    (None for a sequence's first block)."""
    ids = tuple(tokens)
    return hash((parent[0] if parent is not None else ROOT_HASH, ids)), ids


def extend_keys(
    keys: list[BlockKey],
    num_blocks: int,
    block_size: int,
    tokens_from: Callable[[int, int], Sequence[int]],
) -> list[BlockKey]:
    """Extend ``keys`` (a sequence's block keys, in order) in place to its first
    ``num_blocks`` blocks, hashing only the blocks not keyed yet; returns ``keys``.

    Args:
        keys: keys already known (a prefix of the sequence's keys).
        num_blocks: full blocks the sequence has (each ``block_size`` tokens).
        block_size: tokens per block.
        tokens_from: ``(start, count)`` to the token ids at those positions.
    """
    while len(keys) < num_blocks:
        start = len(keys) * block_size
        keys.append(block_key(keys[-1] if keys else None, tokens_from(start, block_size)))
    return keys
