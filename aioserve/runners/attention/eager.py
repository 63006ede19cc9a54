"""Eager attention for what SDPA cannot express (soft-cap, sinks), as
``eager_attention_forward``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aioserve.runners.attention.layer_rules import LayerRules


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return states
    b, heads, length, dim = states.shape
    return states[:, :, None].expand(b, heads, groups, length, dim).reshape(
        b, heads * groups, length, dim
    )


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
    rules: LayerRules, sinks: torch.Tensor | None,
) -> torch.Tensor:
    """``q`` ``[b, q_heads, Q, k_dim]`` over ``[b, kv_heads, L, dim]`` K/V -> ``[b, q_heads, Q,
    v_dim]``."""
    groups = q.shape[1] // keys.shape[1]
    keys, values = _repeat_kv(keys, groups), _repeat_kv(values, groups)
    scaling = rules.scaling if rules.scaling is not None else rules.k_dim**-0.5
    scores = torch.matmul(q, keys.transpose(2, 3)) * scaling
    if rules.softcap is not None:
        scores = torch.tanh(scores / rules.softcap) * rules.softcap
    if mask is not None:
        scores = scores + mask
    if sinks is None:
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    else:
        column = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], -1)
        logits = torch.cat([scores, column.to(scores.dtype)], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        weights = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1].to(values.dtype)
    return torch.matmul(weights, values)
