"""BlockManager: all-or-nothing allocation, frees, integrity checks."""

from __future__ import annotations

import pytest

from aioserve.kv_cache import BlockManager


def test_allocation_is_all_or_nothing():
    blocks = BlockManager(num_blocks=4, block_size=16)
    first = blocks.allocate(3)
    assert first is not None and len(set(first)) == 3
    assert blocks.allocate(2) is None
    assert blocks.num_free_blocks == 1
    assert blocks.usage == 0.75
    blocks.free(first)
    assert blocks.num_free_blocks == 4 and blocks.usage == 0.0
    blocks.check_integrity(held=[])


def test_blocks_for_tokens_rounds_up():
    blocks = BlockManager(num_blocks=8, block_size=16)
    assert [blocks.blocks_for_tokens(n) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]


def test_double_free_and_foreign_ids_are_refused():
    blocks = BlockManager(num_blocks=2, block_size=4)
    taken = blocks.allocate(1)
    blocks.free(taken)
    with pytest.raises(ValueError, match="not allocated"):
        blocks.free(taken)
    with pytest.raises(ValueError, match="not allocated"):
        blocks.free([99])


def test_integrity_check_catches_tables_that_disagree():
    blocks = BlockManager(num_blocks=4, block_size=4)
    a, b = blocks.allocate(2), blocks.allocate(1)
    blocks.check_integrity(held=[a, b])
    with pytest.raises(AssertionError):
        blocks.check_integrity(held=[a])
    with pytest.raises(AssertionError):
        blocks.check_integrity(held=[a, b, a[:1]])


def test_sizes_must_be_positive():
    with pytest.raises(ValueError):
        BlockManager(num_blocks=0, block_size=16)
