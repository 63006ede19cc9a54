"""The KV-cache block pool; block ids index the runner's physical K/V tensors."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

from aioserve.block_keys import BlockKey


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """KV blocks of ``block_size`` tokens needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_size)


class BlockManager:
    """A pool of fixed-size KV-cache blocks; allocation is all or nothing.

    A block is free, in use (reference count >= 1) or, with ``enable_caching``, cached
    (a key, no holder, evicted least recently used first); shared blocks are read-only.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._ref: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._key_of: dict[int, BlockKey] = {}
        self._block_of: dict[BlockKey, int] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free plus cached and unused."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (in use or evictable)."""
        return len(self._block_of)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use by requests, 0–1 (cached unused blocks count as free)."""
        return len(self._ref) / self.num_blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return blocks_for_tokens(num_tokens, self.block_size)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take ``num_blocks`` blocks (free ones first, then evicting cached ones), or
        None and nothing if too few are available."""
        if num_blocks > self.num_free_blocks:
            return None
        taken = self._free[-num_blocks:] if num_blocks else []
        if taken:
            del self._free[-len(taken) :]
        while len(taken) < num_blocks:
            block_id, _ = self._evictable.popitem(last=False)
            del self._block_of[self._key_of.pop(block_id)]
            self.num_evictions += 1
            taken.append(block_id)
        for block_id in taken:
            self._ref[block_id] = 1
        return taken

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference to each block (a table's later blocks are evicted first);
        ValueError for a block not in use."""
        for block_id in block_ids:
            if block_id not in self._ref:
                raise ValueError(f"block {block_id} is not allocated")
        for block_id in reversed(block_ids):
            count = self._ref[block_id] - 1
            if count:
                self._ref[block_id] = count
                continue
            del self._ref[block_id]
            if block_id in self._key_of:
                self._evictable[block_id] = None
            else:
                self._free.append(block_id)

    def match(self, keys: Sequence[BlockKey]) -> list[int]:
        """The cached blocks of the longest prefix of ``keys``; takes no reference."""
        found: list[int] = []
        block_of = self._block_of
        for key in keys:
            block_id = block_of.get(key)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def num_unused(self, block_ids: Sequence[int]) -> int:
        """How many of these cached blocks nobody holds (sharing takes them from free)."""
        return sum(1 for b in block_ids if b in self._evictable)

    def share(self, block_ids: Sequence[int]) -> None:
        """Take a reference to each cached block (from :meth:`match`)."""
        for block_id in block_ids:
            if block_id in self._evictable:
                del self._evictable[block_id]
                self._ref[block_id] = 1
            else:
                self._ref[block_id] += 1

    def cache(self, block_id: int, key: BlockKey) -> None:
        """Register an in-use block full of computed tokens under ``key`` (first wins)."""
        if self.enable_caching and key not in self._block_of and block_id not in self._key_of:
            self._block_of[key] = block_id
            self._key_of[block_id] = key

    def reset_cache(self) -> None:
        """Forget every key (vLLM's ``reset_prefix_cache``); blocks in use stay held."""
        self._free.extend(reversed(self._evictable))
        self._evictable.clear()
        self._key_of.clear()
        self._block_of.clear()

    def check_integrity(self, held: list[list[int]] | None = None) -> None:
        """Assert that the pool's states partition it, its key maps agree, and ``held``
        (every block table) accounts for each reference exactly."""
        free, used, idle = set(self._free), set(self._ref), set(self._evictable)
        assert len(free) == len(self._free), "a block is free twice"
        assert not (free & used or free & idle or used & idle), "a block is in two states"
        assert len(free) + len(used) + len(idle) == self.num_blocks, "blocks were lost"
        assert all(count > 0 for count in self._ref.values()), "a reference count is not positive"
        assert idle <= set(self._key_of), "an evictable block has no key"
        assert not (free & set(self._key_of)), "a free block has a key"
        assert all(self._block_of[k] == b for b, k in self._key_of.items()), "key maps disagree"
        assert len(self._block_of) == len(self._key_of), "key maps differ in size"
        if held is not None:
            for table in held:
                assert len(table) == len(set(table)), "a block is twice in one table"
            counts = Counter(b for table in held for b in table)
            assert counts == Counter(self._ref), "references differ from the block tables"
