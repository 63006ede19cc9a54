"""FlexAttention block masks over the paged KV cache, read in place.

The keys handed to ``flex_attention`` are the whole physical cache of a layer,
``[1, kv_heads, S, k_dim]`` with ``S = num_blocks * block_size`` (a strided view of
the runner's ``[S, kv_heads, k_dim]`` cache: no copy), broadcast over a query batch
of one row per sequence. Each sequence's row of the :class:`BlockMask` lists the
physical blocks of its own block table (the mask's KV block size is the cache's
block size), so the fused kernel visits only them; the idea is the one of torch's
``torch.nn.attention.experimental._paged_attention`` and vLLM's FlexAttention
backend (``vllm/v1/attention/backends/flex_attention.py``), after the FlexAttention
paper (Dong et al. 2024, arXiv:2412.05496).

The mask function alone is exact: it maps a physical key slot to its logical
position through :func:`logical_index` (one entry per physical block) and checks
that the block belongs to the query's sequence, then applies causality and the
sliding window. The block lists only skip work: a block is *full* (no mask function
call) only when every query of the tile sees all of it, and every visible slot lies
in a listed block, so the fused kernel and the unfused one (which ignores the lists
and evaluates the mask everywhere, as on the CPU in eager mode) give the same result.

Everything here is torch ops with shapes fixed by their arguments and no host
synchronisation, so a CUDA graph can capture it (see :mod:`aioserve.runners.gpu.cuda_graphs`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

#: Query tile of the block masks (tokens): torch's default sparse block size.
Q_BLOCK = 128


def logical_index(
    tables: torch.Tensor, num_blocks: torch.Tensor, total_blocks: int
) -> torch.Tensor:
    """``[total_blocks + 1]`` int32: each physical block's index in the tables that
    hold it (-1: in none; the last entry collects the unused columns).

    Args:
        tables: ``[b, W]`` int32 block tables (columns past a row's count are ignored).
        num_blocks: ``[b]`` int32, how many columns of each row are the sequence's.
        total_blocks: physical blocks in the cache.

    A block shared by several tables (prefix caching) must sit at the same column in
    each (:func:`check_shared` checks it on the host).
    """
    width = tables.shape[1]
    columns = torch.arange(width, dtype=torch.int32, device=tables.device).expand_as(tables)
    used = columns < num_blocks[:, None]
    rows = torch.where(used, tables, torch.full_like(tables, total_blocks))
    logical = torch.full((total_blocks + 1,), -1, dtype=torch.int32, device=tables.device)
    return logical.index_put_((rows.reshape(-1).long(),), columns.reshape(-1))


def paged_mask_mod(
    tables: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor, logical: torch.Tensor,
    block_size: int, window: int | None,
) -> MaskMod:
    """The exact mask: query ``q`` of sequence ``b`` (position ``starts[b] + q``, real
    when ``q < counts[b]``) sees physical slot ``kv`` when its block is in ``b``'s
    table at the block's logical column and its position ``k`` satisfies ``k <= p``
    (and ``p - window < k`` for a sliding window; transformers' convention).

    Args:
        tables: ``[b, W]`` int32; starts, counts: ``[b]`` int32; logical: from
            :func:`logical_index`.
    """
    width = tables.shape[1]

    def mask(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        block = kv // block_size
        column = logical[block]
        own = tables[b, column.clamp(0, width - 1)] == block
        member = (column >= 0) & (column < width) & own
        key_pos = column * block_size + kv % block_size
        query_pos = starts[b] + q
        allowed = member & (q < counts[b]) & (key_pos <= query_pos)
        if window is not None:
            allowed = allowed & (key_pos > query_pos - window)
        return allowed

    return mask


def _pack(selected: torch.Tensor, tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block lists of ``selected`` ``[b, R, W]``: indices ``[b, 1, R, W]`` int32 (the
    selected physical blocks first, in column order) and counts ``[b, 1, R]`` int32."""
    order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True)
    blocks = torch.gather(tables[:, None, :].expand_as(selected), -1, order)
    counts = selected.sum(-1, dtype=torch.int32)
    return blocks.to(torch.int32)[:, None], counts[:, None]


def paged_block_mask(
    tables: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor, logical: torch.Tensor,
    block_size: int, q_len: int, kv_len: int, window: int | None,
) -> BlockMask:
    """The block mask of a group of ``b`` sequences, ``q_len`` (padded) queries each,
    over the whole cache of ``kv_len`` slots.

    Args:
        tables: ``[b, W]`` int32 block tables, W covering every row's context.
        starts: ``[b]`` int32 position of each row's first query; counts ``[b]`` int32
            its real queries (1 for decode, ``<= q_len``).
        logical: :func:`logical_index` of the step.
        block_size: tokens per cache block (the mask's KV block size).
        q_len, kv_len: query length (the largest count) and cache slots.
        window: sliding window in tokens, or None.

    Memory: four ``[b, ceil(q_len / Q_BLOCK), W]`` temporaries; no key or value copy.
    """
    width, device = tables.shape[1], tables.device
    first = torch.arange(0, q_len, Q_BLOCK, dtype=torch.int32, device=device)  # [R]
    real = first[None] < counts[:, None]  # [b, R] tiles holding real queries
    low = starts[:, None] + first  # first query position of each tile
    high = starts[:, None] + torch.minimum(first + Q_BLOCK, counts[:, None]) - 1
    if window is None:
        seen_low = all_low = torch.zeros_like(low)
    else:  # the lowest key some query of the tile sees, and the lowest every one sees
        seen_low, all_low = low - window + 1, high - window + 1
    key_first = torch.arange(width, dtype=torch.int32, device=device) * block_size
    key_last = key_first + block_size - 1
    touched = real[..., None] & (key_last >= seen_low[..., None]) & (key_first <= high[..., None])
    full = real[..., None] & (key_first >= all_low[..., None]) & (key_last <= low[..., None])
    full_blocks, full_counts = _pack(full, tables)
    partial_blocks, partial_counts = _pack(touched & ~full, tables)
    return BlockMask.from_kv_blocks(
        partial_counts, partial_blocks, full_counts, full_blocks,
        BLOCK_SIZE=(Q_BLOCK, block_size),
        mask_mod=paged_mask_mod(tables, starts, counts, logical, block_size, window),
        seq_lengths=(q_len, kv_len), compute_q_blocks=False,
    )


def decode_block_masks(
    block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int, kv_len: int,
    windows: tuple[int | None, ...],
) -> dict[int | None, BlockMask]:
    """Per window (None: full causal), the block mask of a decode batch from static
    buffers: ``block_table`` ``[B, W]`` int32 and ``seq_lens`` ``[B]`` int32 (>= 1;
    the new token is the last of each context). Shapes depend on B and W only."""
    seq_lens = seq_lens.to(torch.int32)
    counts = torch.ones_like(seq_lens)
    used = (seq_lens + block_size - 1) // block_size
    logical = logical_index(block_table, used, kv_len // block_size)
    return {
        window: paged_block_mask(block_table, seq_lens - 1, counts, logical, block_size, 1,
                                 kv_len, window)
        for window in windows
    }


def check_block_size(block_size: int, device: torch.device) -> None:
    """Raises ValueError when the Triton kernels cannot tile ``block_size`` (the
    mask's KV block): on CUDA it must be a power of two of at least 16."""
    if device.type == "cuda" and (block_size < 16 or block_size & (block_size - 1)):
        raise ValueError(f"flex backend on CUDA needs a power-of-two block_size >= 16, "
                         f"got {block_size}")


def check_shared(tables: np.ndarray, used: np.ndarray) -> None:
    """Raises ValueError when a block sits at different columns of two block tables
    (``tables`` ``[B, W]``, ``used`` ``[B]`` columns per row): the mask maps each
    physical block to one logical position."""
    columns = np.broadcast_to(np.arange(tables.shape[1]), tables.shape)
    valid = columns < used[:, None]
    blocks, cols = tables[valid], columns[valid]
    order = np.lexsort((cols, blocks))
    blocks, cols = blocks[order], cols[order]
    clash = (blocks[1:] == blocks[:-1]) & (cols[1:] != cols[:-1])
    if clash.any():
        block = int(blocks[1:][clash][0])
        raise ValueError(f"KV block {block} is at two different positions in the block tables")
