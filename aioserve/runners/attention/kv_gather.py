"""Block gathers from the paged KV cache, into buffers reused by every layer and step.

Attention over a paged cache first copies each sequence's blocks into one dense
``[kv_heads, b, L, dim]`` tensor per K and V. Those copies are the largest tensors of a
decode step (32 sequences x 304 keys of SmolLM2-135M's shape: 7.5 MB each, 60 per
step). Allocated afresh, each is a new ``mmap`` that glibc's ``malloc`` hands back to
the OS on ``free``, so every step pays a page fault per 4 KiB it writes. Measured on
the 2-core development box, one 32-row decode step of that shape: 338 ms with a new
tensor per gather, 145 ms writing into :class:`GatherBuffers` (PyTorch's CPU tuning
guide names the same cost as the reason to swap the allocator: "Switch Memory
allocator", https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html).
"""

from __future__ import annotations

import torch

__all__ = ["GatherBuffers", "gather", "gather_index", "is_head_major"]


class GatherBuffers:
    """Two grow-only flat buffers per (device, dtype), one for keys and one for values.

    A gathered tensor lives until its layer's attention returns; the next gather into
    the same buffer overwrites it, so the steps that share one must run one after
    another (a runner's worker thread does; on CUDA, one stream orders them). Memory
    held, per (device, dtype): the largest K gather and the largest V gather seen, each
    with a quarter more room to grow (at most ``2.5 * max(b * L * kv_heads * dim) *
    itemsize`` bytes), kept for the runner's life as a caching allocator would.
    """

    def __init__(self) -> None:
        self._flat: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}

    def take(self, which: int, rows: int, width: int, like: torch.Tensor) -> torch.Tensor:
        """A ``[rows, width]`` tensor of ``like``'s device and dtype in buffer ``which``
        (0: keys, 1: values); its contents are garbage until written."""
        key = (which, like.device, like.dtype)
        size = rows * width
        flat = self._flat.get(key)
        if flat is None or flat.numel() < size:
            flat = self._flat[key] = like.new_empty(size + size // 4)  # room to grow
        return flat[:size].view(rows, width)

    def nbytes(self) -> int:
        """Bytes the buffers hold."""
        return sum(flat.numel() * flat.element_size() for flat in self._flat.values())


def is_head_major(cache: torch.Tensor) -> bool:
    """Whether a layer's cache ``[rows, heads, dim]`` is a transposed view of head-major
    ``[heads, rows, dim]`` storage (with one head both layouts are the same memory).
    Reads strides only: no view is made (it runs for every layer of every step)."""
    rows, heads, dim = cache.shape
    return cache.stride(2) == 1 and cache.stride(0) == dim \
        and (heads == 1 or cache.stride(1) == rows * dim)


def gather_index(cache: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """Rows of :func:`gather`'s 2-D view of ``cache`` holding ``blocks`` (``[n]``
    int64): the blocks themselves for a token-major cache, each head's copy of them
    (``[heads * n]``) for a head-major one. K and V of a layer share it."""
    if cache.is_contiguous():
        return blocks
    per_head = int(cache.shape[0]) // block_size
    offsets = torch.arange(0, int(cache.shape[1]) * per_head, per_head, device=blocks.device)
    return (offsets[:, None] + blocks).view(-1)


def gather(
    cache: torch.Tensor, index: torch.Tensor, block_size: int,
    buffers: GatherBuffers | None = None, which: int = 0,
) -> torch.Tensor:
    """``[heads, n, block_size, dim]``: whole blocks of a layer's cache
    ``[rows, heads, dim]``, head-major (``index`` from :func:`gather_index`), written
    into ``buffers``' buffer ``which`` (None: a new tensor).

    A head-major cache (a transposed view of ``[heads, rows, dim]`` storage, as the CPU
    reference backend allocates it) gathers each head's blocks as contiguous slabs; a
    token-major one (contiguous) gathers whole blocks as rows of a 2-D view, then
    moves the head axis to the front (a view; with one head, no copy). index_select of
    whole blocks is a plain copy, several times cheaper on the CPU than advanced
    indexing per slot, with the same values.
    """
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
