"""CPU decode attention over head-major gathered keys as two batched products: each (KV head,
sequence) is one contiguous ``[L, dim]`` matrix and its query heads the rows of one product, so
no product works for another head. Batch-invariant once a context spans at least
``MIN_CONTEXT_WIDTH`` keys; padding adds exact zeros."""

from __future__ import annotations

import torch


def queries_by_kv_head(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``q`` ``[b, heads, dim]`` as ``[kv_heads, b, heads // kv_heads, dim]`` (one copy)."""
    batch, heads, dim = (int(n) for n in q.shape)
    return q.view(batch, kv_heads, heads // kv_heads, dim).transpose(0, 1).contiguous()


def heads_by_sequence(out: torch.Tensor) -> torch.Tensor:
    """``[kv_heads, b, group, v_dim]`` -> ``[b, kv_heads * group, v_dim]`` (one copy)."""
    kv_heads, batch, group, v_dim = (int(n) for n in out.shape)
    return out.transpose(0, 1).reshape(batch, kv_heads * group, v_dim)


def decode_bias(mask: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The ``[b, 1, 1, L]`` mask as ``[kv_heads * b, 1, L]``, made once a step for every layer."""
    batch, length = int(mask.shape[0]), int(mask.shape[-1])
    return mask.view(1, batch, 1, length).expand(kv_heads, -1, -1, -1).reshape(-1, 1, length)


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """``q`` ``[b, heads, k_dim]`` over ``[kv_heads, b, L, dim]`` K/V -> ``[b, heads, v_dim]``."""
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
