"""Paged attention for packed batches, plugged into transformers' attention interface.

Any transformers decoder model runs unchanged: the model is loaded with
``attn_implementation=ATTENTION_NAME``; each attention layer then calls
:func:`paged_attention`, which writes the step's new keys/values into the paged KV
cache and attends over each sequence's own context only (no padding is shared
between requests, so a request's result never depends on its batch-mates). The
hook points are the ones transformers' own continuous batching uses
(``AttentionInterface`` / ``AttentionMaskInterface``, Apache-2.0).

This is the reference path: exact on CPU (one ``scaled_dot_product_attention`` per
layer over a gathered, masked context).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

ATTENTION_NAME = "aioserve_paged"


@dataclass(frozen=True)
class PagedAttentionMetadata:
    """Per-step tensors shared by all layers (B sequences, T new tokens).

    Attributes:
        kv_caches: per layer, (K, V) of shape ``[num_blocks * block_size, kv_heads, head_dim]``.
        slot_mapping: ``[T]`` int64, the cache slot each new token's K/V is written to.
        gather_slots: ``[B, L]`` int64, the slots of each sequence's context
            (L = longest context; padding points at slot 0 and is masked).
        mask: ``[B, 1, Q, L]`` bool, True where a query may attend a key.
        query_index: ``[B, Q]`` int64 index of each query in the packed tokens, or None
            when every sequence feeds exactly one token (pure decode, Q = 1).
        query_valid: ``[B, Q]`` bool, real (not padding) queries; None with query_index.
    """

    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    slot_mapping: torch.Tensor
    gather_slots: torch.Tensor
    mask: torch.Tensor
    query_index: torch.Tensor | None
    query_valid: torch.Tensor | None


def build_metadata(
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    start_positions: list[int],
    num_new_tokens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
) -> tuple[PagedAttentionMetadata, torch.Tensor]:
    """Build the step's metadata and the packed position ids (``[T]`` int64)."""
    batch = len(start_positions)
    width = max(len(t) for t in block_tables)
    padded = [t + [0] * (width - len(t)) for t in block_tables]
    tables = torch.tensor(padded, dtype=torch.int64, device=device)
    starts = torch.tensor(start_positions, dtype=torch.int64, device=device)
    counts = torch.tensor(num_new_tokens, dtype=torch.int64, device=device)
    seq_lens = starts + counts
    rows = torch.arange(batch, device=device)
    max_new = max(num_new_tokens)
    if max_new == 1:
        seq_of_token, positions = rows, starts
    else:
        seq_of_token = torch.repeat_interleave(rows, counts)
        offsets = torch.cumsum(counts, 0) - counts
        positions = torch.arange(seq_of_token.numel(), device=device) - offsets[seq_of_token]
        positions = positions + starts[seq_of_token]
    slot_mapping = (
        tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    )
    context = torch.arange(
        max(s + n for s, n in zip(start_positions, num_new_tokens)), device=device
    )
    block_of = (context // block_size).clamp(max=width - 1).expand(batch, -1)
    gather_slots = tables.gather(1, block_of) * block_size + context % block_size
    in_context = context.unsqueeze(0) < seq_lens.unsqueeze(1)
    if max_new == 1:
        mask = in_context[:, None, None, :]
        query_index = query_valid = None
    else:
        j = torch.arange(max_new, device=device)
        query_valid = j.unsqueeze(0) < counts.unsqueeze(1)
        query_index = (offsets.unsqueeze(1) + j).clamp(max=seq_of_token.numel() - 1)
        query_pos = starts.unsqueeze(1) + j
        causal = context.view(1, 1, -1) <= query_pos.unsqueeze(2)
        mask = (causal & in_context.unsqueeze(1)).unsqueeze(1)
    metadata = PagedAttentionMetadata(
        kv_caches, slot_mapping, gather_slots, mask, query_index, query_valid
    )
    return metadata, positions


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    paged_metadata: PagedAttentionMetadata | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over the paged KV cache for a packed batch.

    Args:
        query: ``[1, q_heads, T, head_dim]``; key, value: ``[1, kv_heads, T, head_dim]``.
        paged_metadata: this step's :class:`PagedAttentionMetadata`.

    Returns:
        ``([1, T, q_heads, head_dim], None)``.

    Raises:
        RuntimeError: the model was called without ``paged_metadata``.
    """
    meta = paged_metadata
    if meta is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention needs paged_metadata (use TorchRunner)")
    k_cache, v_cache = meta.kv_caches[module.layer_idx]
    k_cache.index_copy_(0, meta.slot_mapping, key[0].transpose(0, 1))
    v_cache.index_copy_(0, meta.slot_mapping, value[0].transpose(0, 1))
    keys = k_cache[meta.gather_slots].transpose(1, 2)
    values = v_cache[meta.gather_slots].transpose(1, 2)
    q = query[0].transpose(0, 1)
    q = q.unsqueeze(1) if meta.query_index is None else q[meta.query_index]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        keys,
        values,
        attn_mask=meta.mask,
        scale=scaling,
        enable_gqa=q.shape[2] != keys.shape[1],
    ).transpose(1, 2)
    out = out.squeeze(1) if meta.query_valid is None else out[meta.query_valid]
    return out.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The attention function builds each sequence's causal mask itself."""
    return None


def register() -> str:
    """Register the attention and mask functions with transformers; returns the name."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    return ATTENTION_NAME
