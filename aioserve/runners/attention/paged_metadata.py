"""Per-step paged-attention metadata, built on the host once per step: decode groups (Q = 1,
split by length when short ones would mostly attend padding) and a prefill group (padded to the
longest), so a prefill never pads decoding queries. Index arithmetic in numpy (a small torch op
costs several microseconds), each result copied to the device once."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from aioserve.runners.attention.kv_gather import GatherBuffers
from aioserve.runners.attention.sparse_decode import SparseDecodeIndex
from aioserve.runners.batch_invariance import MIN_CONTEXT_WIDTH

# Additive masks: 0 where a query may attend a key, -inf elsewhere (transformers' convention).
_PREFIX_MASKS = np.zeros((1, 0), dtype=np.float32)


def visible_prefix(lengths: np.ndarray, width: int) -> np.ndarray:
    """``[len(lengths), width]``: row i is 0 at its first ``lengths[i]`` columns."""
    global _PREFIX_MASKS
    if _PREFIX_MASKS.shape[1] < width:  # row i: -inf from column i on
        _PREFIX_MASKS = np.triu(np.full((width + 1, width), -np.inf, dtype=np.float32))
    return _PREFIX_MASKS[np.minimum(lengths, width), :width]


def window_mask(query_pos: np.ndarray, width: int, window: int) -> np.ndarray:
    """``[b, 1, Q, width]`` mask of ``p - window < k <= p`` for ``query_pos`` ``[b, Q]``."""
    keys = np.arange(width)[None, None, :]
    pos = query_pos[:, :, None]
    allowed = (keys <= pos) & (keys > pos - window)
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))[:, None]


@dataclass(frozen=True)
class AttentionGroup:
    """Sequences that attend in one call (b sequences, Q padded queries, L keys).

    Attributes:
        token_index: ``[n]`` int64 packed rows of the queries; None: every token in order.
        gather_blocks: ``[b, L / block_size]`` int64 KV blocks (past a table: masked).
        mask: ``[b, 1, Q, L]`` additive mask in the cache dtype; None when none is masked.
        query_index, query_valid: ``[b * Q]`` and ``[n]`` int64 padded/real rows; None at Q = 1.
        window_masks: per sliding window, its ``[b, 1, Q, L]`` additive mask.
        sparse_indices, gather_indices, decode_biases: per-step caches built by the first layer.
        seq_lens: ``[b]`` int64 contexts when the compiled kernel attends the group, else None."""

    token_index: torch.Tensor | None
    gather_blocks: torch.Tensor
    mask: torch.Tensor | None
    query_index: torch.Tensor | None
    query_valid: torch.Tensor | None
    window_masks: dict[int, torch.Tensor] = field(default_factory=dict)
    sparse_indices: dict[tuple[int, int, int], SparseDecodeIndex] = field(default_factory=dict)
    gather_indices: dict[tuple[int, int, bool], torch.Tensor] = field(default_factory=dict)
    decode_biases: dict[int, torch.Tensor] = field(default_factory=dict)
    seq_lens: torch.Tensor | None = None


@dataclass(frozen=True)
class PagedAttentionMetadata:
    """What every layer of one step needs: caches, ``slot_mapping`` ``[T]``, groups, buffers."""

    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    slot_mapping: torch.Tensor
    groups: tuple[AttentionGroup, ...]
    block_size: int
    buffers: GatherBuffers | None = None


#: Extra attention call, in key visits (rows x context positions): what one more
#: ``scaled_dot_product_attention`` call plus the query/output shuffles cost on CPU.
SPLIT_COST = 2048


#: Most groups the decoding sequences are split into by context length.
MAX_DECODE_GROUPS = 4


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A contiguous tensor on ``device`` holding ``array`` (no copy on the CPU)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def block_table_array(block_tables: list[list[int]]) -> np.ndarray:
    """``[B, W]`` int64, each row padded with its own first block (0 when empty)."""
    width = max(map(len, block_tables))
    flat: list[int] = []
    for table in block_tables:
        flat += table
        flat += [table[0] if table else 0] * (width - len(table))
    return np.fromiter(flat, dtype=np.int64, count=len(flat)).reshape(len(block_tables), width)


def _group(
    rows: np.ndarray,
    tables: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    offsets: np.ndarray,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    everything: bool,
    windows: tuple[int, ...] = (),
    native_decode: bool = False,
    min_context: int = MIN_CONTEXT_WIDTH,
) -> AttentionGroup:
    """The group of batch ``rows``, spanning at least ``min_context`` keys."""
    starts, counts, offsets = starts[rows], counts[rows], offsets[rows]
    seq_lens = starts + counts
    num_blocks = -(-max(int(seq_lens.max()), min_context) // block_size)
    blocks = tables[rows, :num_blocks]
    width = num_blocks * block_size
    max_new = int(counts.max())
    query_index = query_valid = None
    mask_array: np.ndarray | None
    if max_new == 1:
        token_index = offsets
        short = int(seq_lens.min()) < width
        mask_array = visible_prefix(seq_lens, width)[:, None, None, :] if short else None
    else:
        token_index = np.concatenate([np.arange(o, o + c) for o, c in zip(offsets, counts)])
        j = np.arange(max_new)
        valid = j[None, :] < counts[:, None]
        local = np.cumsum(counts) - counts
        padded = np.minimum(local[:, None] + j, counts.sum() - 1)
        query_index = to_device(padded.reshape(-1), device)
        query_valid = to_device(np.flatnonzero(valid), device)
        context = np.arange(width)
        in_context = context[None, :] < seq_lens[:, None]
        causal = context[None, None, :] <= (starts[:, None] + j)[:, :, None]
        allowed = (causal & in_context[:, None, :])[:, None]
        mask_array = None
        if not allowed.all():
            mask_array = np.where(allowed, np.float32(0.0), np.float32(-np.inf))
    mask = None if mask_array is None else to_device(mask_array, device).to(dtype)
    # each (padded) query's position; a padding query repeats its sequence's last
    query_pos = starts[:, None] + np.minimum(np.arange(max_new)[None, :], counts[:, None] - 1)
    window_masks = {
        window: to_device(window_mask(query_pos, width, window), device).to(dtype)
        for window in windows
    }
    return AttentionGroup(
        None if everything else to_device(token_index, device),
        to_device(blocks, device),
        mask,
        query_index,
        query_valid,
        window_masks,
        seq_lens=to_device(seq_lens, device) if native_decode and max_new == 1 else None,
    )


def split_by_length(
    rows: np.ndarray, seq_lens: np.ndarray, call_cost: int, max_groups: int = 2
) -> list[np.ndarray]:
    """Split rows into up to ``max_groups`` by length where padding saved beats ``call_cost``."""
    if rows.size < 4 or max_groups < 2:
        return [rows]
    order = rows[np.argsort(seq_lens[rows], kind="stable")]
    lens = seq_lens[order]
    n = lens.size
    cut = np.arange(1, n)
    cost = cut * lens[cut - 1] + (n - cut) * lens[-1] + call_cost
    best = int(np.argmin(cost))
    if cost[best] >= n * lens[-1]:
        return [rows]
    first, second = np.sort(order[: best + 1]), np.sort(order[best + 1 :])
    if max_groups < 4:
        return [first, second]
    half = max_groups // 2
    return [*split_by_length(first, seq_lens, call_cost, half),
            *split_by_length(second, seq_lens, call_cost, max_groups - half)]


def build_metadata(
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    start_positions: list[int] | np.ndarray,
    num_new_tokens: list[int] | np.ndarray,
    block_tables: list[list[int]] | np.ndarray,
    block_size: int,
    device: torch.device,
    *,
    windows: tuple[int, ...] = (),
    buffers: GatherBuffers | None = None,
    native_decode: bool = False,
    min_context: int = MIN_CONTEXT_WIDTH,
) -> tuple[PagedAttentionMetadata, torch.Tensor]:
    """The step's metadata and packed positions ``[T]`` int64.

    Args:
        start_positions, num_new_tokens: per sequence, first new position and count (>= 1).
        block_tables: lists, or a ``[B, W]`` int64 array (entries past a table any valid block).
        windows: one mask per sliding window.
        native_decode: one decode group with ``seq_lens`` for the compiled kernel.
        min_context: the batch-invariance floor (1 when off)."""
    batch = len(start_positions)
    tables = (block_tables if isinstance(block_tables, np.ndarray)
              else block_table_array(block_tables))
    min_blocks = -(-min_context // block_size)
    if tables.shape[1] < min_blocks:  # every group spans min_context keys (masked)
        extra = np.repeat(tables[:, :1], min_blocks - tables.shape[1], axis=1)
        tables = np.concatenate((tables, extra), axis=1)
    starts = np.asarray(start_positions, dtype=np.int64)
    counts = np.asarray(num_new_tokens, dtype=np.int64)
    offsets = np.cumsum(counts) - counts
    seq_of_token = np.repeat(np.arange(batch), counts)
    positions = np.arange(seq_of_token.size) - offsets[seq_of_token] + starts[seq_of_token]
    slot_mapping = (
        tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    )
    dtype = kv_caches[0][0].dtype
    decode = np.flatnonzero(counts == 1)
    prefill = np.flatnonzero(counts > 1)
    seq_lens = starts + counts
    parts = [
        *split_by_length(decode, seq_lens, SPLIT_COST, 1 if native_decode else MAX_DECODE_GROUPS),
        # a prefill row costs about (new tokens x context) query-key pairs
        *split_by_length(prefill, seq_lens * counts, SPLIT_COST),
    ]
    groups = tuple(
        _group(rows, tables, starts, counts, offsets, block_size, dtype, device,
               rows.size == batch, windows, native_decode, min_context)
        for rows in parts
        if rows.size
    )
    metadata = PagedAttentionMetadata(
        kv_caches, to_device(slot_mapping, device), groups, block_size, buffers
    )
    return metadata, to_device(positions, device)
