"""The KV-cache block pool. Block ids index the runner's physical K/V tensors."""

from __future__ import annotations


class BlockManager:
    """A free list of fixed-size KV-cache blocks; allocation is all or nothing.

    Args:
        num_blocks: blocks in the pool.
        block_size: tokens per block.

    Raises:
        ValueError: a size is not positive.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0–1."""
        return len(self._used) / self.num_blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take ``num_blocks`` blocks, or none at all (returns None) if too few are free."""
        if num_blocks > len(self._free):
            return None
        if num_blocks == 0:
            return []
        taken = self._free[-num_blocks:]
        del self._free[-num_blocks:]
        self._used.update(taken)
        return taken

    def free(self, block_ids: list[int]) -> None:
        """Return blocks to the pool.

        Raises:
            ValueError: a block is not in use (double free or foreign id).
        """
        for block_id in block_ids:
            if block_id not in self._used:
                raise ValueError(f"block {block_id} is not allocated")
            self._used.discard(block_id)
        self._free.extend(reversed(block_ids))

    def check_integrity(self, held: list[list[int]] | None = None) -> None:
        """Assert that free and used blocks partition the pool, and that ``held``
        (each request's block table) is exactly the used set, with no block twice.

        Raises:
            AssertionError: the pool is inconsistent.
        """
        free = set(self._free)
        assert len(free) == len(self._free), "a block is free twice"
        assert not (free & self._used), "a block is both free and used"
        assert len(free) + len(self._used) == self.num_blocks, "blocks were lost"
        if held is not None:
            flat = [b for table in held for b in table]
            assert len(flat) == len(set(flat)), "a block is held by two requests"
            assert set(flat) == self._used, "used blocks differ from the block tables"
