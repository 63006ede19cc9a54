"""Per-step FlexAttention metadata: host-built, or graph-safe for decode; a mask per window."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask

from aioserve.runners.attention import paged_metadata
from aioserve.runners.attention.flex import masks as flex_masks
from aioserve.runners.attention.paged_metadata import PagedAttentionMetadata, to_device


@dataclass(frozen=True)
class FlexGroup:
    """Sequences in one ``flex_attention`` call, index maps as :class:`AttentionGroup`'s."""

    token_index: torch.Tensor | None
    query_index: torch.Tensor | None
    query_valid: torch.Tensor | None
    size: int
    q_len: int
    masks: dict[int | None, BlockMask] = field(default_factory=dict)


@dataclass(frozen=True)
class FlexMetadata(PagedAttentionMetadata):
    """:class:`PagedAttentionMetadata` (its ``groups`` empty) plus the flex groups."""

    flex_groups: tuple[FlexGroup, ...] = ()


def build_metadata(
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    start_positions: list[int] | np.ndarray, num_new_tokens: list[int] | np.ndarray,
    block_tables: list[list[int]] | np.ndarray, block_size: int,
    device: torch.device, windows: tuple[int, ...],
) -> tuple[FlexMetadata, torch.Tensor]:
    """The step's :class:`FlexMetadata` and positions ``[T]`` (inputs as the reference's)."""
    flex_masks.check_block_size(block_size, device)
    tables = (block_tables if isinstance(block_tables, np.ndarray)
              else paged_metadata.block_table_array(block_tables))
    starts = np.asarray(start_positions, dtype=np.int64)
    counts = np.asarray(num_new_tokens, dtype=np.int64)
    used = -(-(starts + counts) // block_size)
    flex_masks.check_shared(tables, used)
    offsets = np.cumsum(counts) - counts
    seq_of_token = np.repeat(np.arange(counts.size), counts)
    positions = np.arange(seq_of_token.size) - offsets[seq_of_token] + starts[seq_of_token]
    slots = tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    kv_len = int(kv_caches[0][0].shape[0])
    tables32 = tables.astype(np.int32)
    logical = flex_masks.logical_index(
        to_device(tables32, device), to_device(used.astype(np.int32), device),
        kv_len // block_size,
    )
    groups = []
    for rows in (np.flatnonzero(counts == 1), np.flatnonzero(counts > 1)):
        if not rows.size:
            continue
        c, q_len = counts[rows], int(counts[rows].max())
        token_index = np.concatenate([np.arange(o, o + n) for o, n in zip(offsets[rows], c)])
        query_index = query_valid = None
        if q_len > 1:
            j = np.arange(q_len)
            padded = (np.cumsum(c) - c)[:, None] + np.minimum(j, c[:, None] - 1)
            query_index = to_device(padded.reshape(-1), device)
            query_valid = to_device(np.flatnonzero(j < c[:, None]), device)
        group_tables = to_device(tables32[rows], device)
        group_starts = to_device(starts[rows].astype(np.int32), device)
        group_counts = to_device(c.astype(np.int32), device)
        masks = {
            window: flex_masks.paged_block_mask(
                group_tables, group_starts, group_counts, logical, block_size, q_len, kv_len,
                window,
            ) for window in (None, *windows)
        }
        everything = rows.size == counts.size
        groups.append(FlexGroup(
            None if everything else to_device(token_index, device),
            query_index, query_valid, int(rows.size), q_len, masks,
        ))
    meta = FlexMetadata(kv_caches, to_device(slots, device), (), block_size,
                        flex_groups=tuple(groups))
    return meta, to_device(positions, device)


def decode_metadata(
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]], slot_mapping: torch.Tensor,
    block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
    windows: tuple[int, ...],
) -> FlexMetadata:
    """Graph-safe decode metadata: shapes depend on B and W only, no host sync."""
    masks = flex_masks.decode_block_masks(
        block_table, seq_lens, block_size, int(kv_caches[0][0].shape[0]), (None, *windows)
    )
    group = FlexGroup(None, None, None, int(block_table.shape[0]), 1, masks)
    return FlexMetadata(kv_caches, slot_mapping, (), block_size, flex_groups=(group,))
