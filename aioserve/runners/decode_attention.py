"""Decode attention on the CPU as two batched matrix products (block-diagonal queries).

For a decode group (one query per sequence) ``scaled_dot_product_attention``'s CPU
kernel works per (sequence, head) pair, and with small heads (head_dim 8-64) that
bookkeeping costs more than the arithmetic. Here each sequence's query heads are
laid out block-diagonally against its keys ``[L, kv_heads * head_dim]`` (the layout
the block gather produces, no transpose copy): one ``baddbmm`` gives every head's
scores, masked and scaled, one ``bmm`` every head's weighted values, and each head
keeps the block of its own key/value head. The products with the zero blocks are
exact zeros, so each head sees the same numbers as in a per-head product; only the
summation order inside the matrix products differs from the fused kernel (about
1e-7 relative, like any two attention kernels).
"""

from __future__ import annotations

import torch

#: Most KV heads for which the block-diagonal form is used (its score product does
#: kv_heads times the useful multiply-adds).
MAX_KV_HEADS = 8

_SELECTORS: dict[tuple[int, int, torch.dtype, torch.device], torch.Tensor] = {}


def head_selector(
    heads: int, kv_heads: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``[heads, kv_heads, 1]`` one-hot: query head h reads KV head ``h // (heads // kv_heads)``."""
    key = (heads, kv_heads, dtype, device)
    selector = _SELECTORS.get(key)
    if selector is None:
        group = heads // kv_heads
        selector = torch.zeros(heads, kv_heads, 1, dtype=dtype, device=device)
        selector[torch.arange(heads), torch.arange(heads) // group] = 1
        _SELECTORS[key] = selector
    return selector


def usable(q: torch.Tensor, kv_heads: int) -> bool:
    """True on the CPU for a grouped-query layout with few KV heads."""
    heads = int(q.shape[1])
    return q.device.type == "cpu" and kv_heads <= MAX_KV_HEADS and heads % kv_heads == 0


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    kv_heads: int,
) -> torch.Tensor:
    """Attention of one query per sequence.

    Args:
        q: ``[b, heads, head_dim]``.
        keys, values: ``[b, L, kv_heads * head_dim]``.
        mask: ``[b, 1, 1, L]`` additive (0 or -inf), or None.
        scaling: score scale (default ``head_dim ** -0.5``).
        kv_heads: KV heads.

    Returns:
        ``[b, heads, head_dim]``.
    """
    heads, dim = int(q.shape[1]), int(q.shape[2])  # constants of the model
    scale = scaling if scaling is not None else dim**-0.5
    selector = head_selector(heads, kv_heads, q.dtype, q.device)
    blocks = (q.unsqueeze(2) * selector).flatten(2)  # [b, heads, kv_heads * head_dim]
    if mask is None:
        scores = torch.bmm(blocks, keys.transpose(1, 2)).mul_(scale)
    else:
        scores = torch.baddbmm(mask.flatten(1, 2), blocks, keys.transpose(1, 2), alpha=scale)
    weights = torch.softmax(scores, dim=-1)
    out = torch.bmm(weights, values).unflatten(2, (kv_heads, dim))
    return (out * selector).sum(2)
