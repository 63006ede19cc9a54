"""Decode attention on the CPU over head-major gathered keys: two batched matrix products.

For a decode group (one query per sequence) ``scaled_dot_product_attention``'s CPU
kernel works per (sequence, head) pair, and with small heads that bookkeeping costs
more than the arithmetic. On the CPU the reference backend keeps each layer's cache
head-major (storage ``[kv_heads, rows, dim]``, see
:func:`~aioserve.runners.model.loader.allocate_kv_cache`), so a block gather yields
``[kv_heads, b, L, dim]``: every (KV head, sequence) pair is one contiguous ``[L, dim]``
matrix, and the query heads sharing a KV head are the rows of one product. One
``baddbmm`` gives every head's scores, masked and scaled, one ``bmm`` every head's
weighted values; no product does work for another head (a block-diagonal form over
token-major keys did ``kv_heads`` times the multiply-adds). Measured on the 2-core
development box, 32 sequences x 304 keys, per layer: SmolLM2-135M's heads (9 query,
3 KV, dim 64) 2.4 -> 1.3 ms, 16 query / 8 KV heads 7.8 -> 3.6 ms, the test model's
(8 / 4, dim 8) 0.37 -> 0.39 ms.

A sequence's scores do not depend on its batch-mates as long as the context is at
least 32 keys wide (MKL computes narrower score products with another kernel, see
``batch_invariance.MIN_CONTEXT_WIDTH``); the softmax and the weighted sum add exact
zeros for padding.
"""

from __future__ import annotations

import torch


def queries_by_kv_head(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``q`` ``[b, heads, dim]`` regrouped ``[kv_heads, b, heads // kv_heads, dim]``
    (contiguous, one copy): the query heads of each KV head side by side; head h reads
    KV head ``h // (heads // kv_heads)``."""
    batch, heads, dim = (int(n) for n in q.shape)
    return q.view(batch, kv_heads, heads // kv_heads, dim).transpose(0, 1).contiguous()


def heads_by_sequence(out: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`queries_by_kv_head` for outputs: ``[kv_heads, b, group,
    v_dim]`` -> ``[b, kv_heads * group, v_dim]`` (one copy)."""
    kv_heads, batch, group, v_dim = (int(n) for n in out.shape)
    return out.transpose(0, 1).reshape(batch, kv_heads * group, v_dim)


def decode_bias(mask: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """A decode group's additive mask ``[b, 1, 1, L]`` repeated per KV head as
    :func:`decode_attention` adds it: ``[kv_heads * b, 1, L]`` (one copy, made once a
    step and read by every layer)."""
    batch, length = int(mask.shape[0]), int(mask.shape[-1])
    return mask.view(1, batch, 1, length).expand(kv_heads, -1, -1, -1).reshape(-1, 1, length)


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """Attention of one query per sequence (grouped-query heads).

    Args:
        q: ``[b, heads, k_dim]``; heads a multiple of kv_heads (head h reads KV head
            ``h // (heads // kv_heads)``).
        keys: ``[kv_heads, b, L, k_dim]``, values ``[kv_heads, b, L, v_dim]``, contiguous.
        bias: the additive mask (0 or -inf) from :func:`decode_bias`,
            ``[kv_heads * b, 1, L]``, or None.
        scaling: score scale (default ``k_dim ** -0.5``).

    Returns:
        ``[b, heads, v_dim]``.
    """
    batch, heads, dim = (int(n) for n in q.shape)
    kv_heads, length, v_dim = int(keys.shape[0]), int(keys.shape[2]), int(values.shape[3])
    group = heads // kv_heads
    scale = scaling if scaling is not None else dim**-0.5
    queries = queries_by_kv_head(q, kv_heads).view(-1, group, dim)
    keys_t = keys.view(-1, length, dim).transpose(1, 2)
    if bias is None:
        scores = torch.bmm(queries, keys_t).mul_(scale)
    else:
        scores = torch.baddbmm(bias, queries, keys_t, alpha=scale)
    weights = torch.softmax(scores, dim=-1)
    out = torch.bmm(weights, values.view(-1, length, v_dim))  # [kv_heads * b, group, v_dim]
    return heads_by_sequence(out.view(kv_heads, batch, group, v_dim))
