"""FlexAttention block masks over the paged KV cache read in place (as torch's experimental paged
attention and vLLM's flex backend).

The mask function alone is exact (physical slot -> logical position, own sequence, causality,
window); the block lists only skip work, so fused and unfused kernels agree. Torch ops with
argument-fixed shapes and no host sync: a CUDA graph can capture them."""

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
    """``[total_blocks + 1]`` int32: each physical block's column in ``tables`` (-1: none)."""
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
    """The exact mask: own block at its logical column, ``k <= p`` and within the window."""
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
    """Block lists of ``selected`` ``[b, R, W]``: indices and counts, int32."""
    order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True)
    blocks = torch.gather(tables[:, None, :].expand_as(selected), -1, order)
    counts = selected.sum(-1, dtype=torch.int32)
    return blocks.to(torch.int32)[:, None], counts[:, None]


def paged_block_mask(
    tables: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor, logical: torch.Tensor,
    block_size: int, q_len: int, kv_len: int, window: int | None,
) -> BlockMask:
    """The block mask of ``b`` sequences of ``q_len`` padded queries over ``kv_len`` slots."""
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
    """Per window (None: causal), a decode batch's block mask from static buffers."""
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
    """ValueError when Triton cannot tile ``block_size`` (on CUDA: a power of two >= 16)."""
    if device.type == "cuda" and (block_size < 16 or block_size & (block_size - 1)):
        raise ValueError(f"flex backend on CUDA needs a power-of-two block_size >= 16, "
                         f"got {block_size}")


def check_shared(tables: np.ndarray, used: np.ndarray) -> None:
    """ValueError when a block sits at different columns of two tables."""
    columns = np.broadcast_to(np.arange(tables.shape[1]), tables.shape)
    valid = columns < used[:, None]
    blocks, cols = tables[valid], columns[valid]
    order = np.lexsort((cols, blocks))
    blocks, cols = blocks[order], cols[order]
    clash = (blocks[1:] == blocks[:-1]) & (cols[1:] != cols[:-1])
    if clash.any():
        block = int(blocks[1:][clash][0])
        raise ValueError(f"KV block {block} is at two different positions in the block tables")
