"""Prefix-cache block keys (vLLM V1's block hashes): a full block is named by a hash
chained over its parent's key, plus its own token ids."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["ROOT_HASH", "BlockKey", "block_key", "extend_keys"]

#: A full block's key: (hash chained over every block up to this one, its token ids).
BlockKey = tuple[int, tuple[int, ...]]

#: Parent hash of a request's first block.
ROOT_HASH = 0


def block_key(parent: BlockKey | None, tokens: Sequence[int]) -> BlockKey:
    """The key of a full block of ``tokens`` after the block keyed ``parent`` (or None)."""
    ids = tuple(tokens)
    return hash((parent[0] if parent is not None else ROOT_HASH, ids)), ids


def extend_keys(
    keys: list[BlockKey],
    num_blocks: int,
    block_size: int,
    tokens_from: Callable[[int, int], Sequence[int]],
) -> list[BlockKey]:
    """Extend a sequence's ``keys`` in place to its first ``num_blocks`` blocks, hashing
    only new ones (``tokens_from(start, count)`` gives token ids); returns ``keys``."""
    while len(keys) < num_blocks:
        start = len(keys) * block_size
        keys.append(block_key(keys[-1] if keys else None, tokens_from(start, block_size)))
    return keys
