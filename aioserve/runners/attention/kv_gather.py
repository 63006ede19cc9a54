"""Block gathers from the paged KV cache into buffers reused by every layer and step."""

from __future__ import annotations

import torch

__all__ = ["GatherBuffers", "gather", "gather_index", "is_head_major"]


class GatherBuffers:
    """Grow-only K and V buffers per (device, dtype); the steps sharing them run in order."""

    def __init__(self) -> None:
        self._flat: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}

    def take(self, which: int, rows: int, width: int, like: torch.Tensor) -> torch.Tensor:
        """A ``[rows, width]`` tensor in buffer ``which`` (0: keys, 1: values), contents garbage."""
        key = (which, like.device, like.dtype)
        size = rows * width
        flat = self._flat.get(key)
        if flat is None or flat.numel() < size:
            flat = self._flat[key] = like.new_empty(size + size // 4)  # room to grow
        return flat[:size].view(rows, width)

    def nbytes(self) -> int:
        return sum(flat.numel() * flat.element_size() for flat in self._flat.values())


def is_head_major(cache: torch.Tensor) -> bool:
    """Whether ``[rows, heads, dim]`` views ``[heads, rows, dim]`` storage (strides only)."""
    rows, heads, dim = cache.shape
    return cache.stride(2) == 1 and cache.stride(0) == dim \
        and (heads == 1 or cache.stride(1) == rows * dim)


def gather_index(cache: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """Rows of :func:`gather`'s 2-D view holding ``blocks`` (per head when head-major)."""
    if cache.is_contiguous():
        return blocks
    per_head = int(cache.shape[0]) // block_size
    offsets = torch.arange(0, int(cache.shape[1]) * per_head, per_head, device=blocks.device)
    return (offsets[:, None] + blocks).view(-1)


def gather(
    cache: torch.Tensor, index: torch.Tensor, block_size: int,
    buffers: GatherBuffers | None = None, which: int = 0,
) -> torch.Tensor:
    """``[heads, n, block_size, dim]`` whole blocks of a layer's cache, into ``buffers``."""
    heads, dim = int(cache.shape[1]), int(cache.shape[2])
    token_major = cache.is_contiguous()
    width = block_size * dim * (heads if token_major else 1)
    # head-major: [heads * blocks, block_size * dim], a view of the storage
    source = cache.view(-1, width) if token_major else cache.transpose(0, 1).reshape(-1, width)
    if buffers is None:
        rows = source.index_select(0, index)
    else:
        rows = torch.index_select(
            source, 0, index, out=buffers.take(which, int(index.numel()), width, cache)
        )
    if token_major:
        return rows.view(-1, block_size, heads, dim).permute(2, 0, 1, 3)
    return rows.view(heads, -1, block_size, dim)
