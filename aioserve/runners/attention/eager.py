"""Attention in eager math, for layers whose rules ``scaled_dot_product_attention``
cannot express: logit soft-capping (gemma2) and attention sinks (gpt_oss).

The arithmetic follows the models' own ``eager_attention_forward`` step for step
(scores, soft-cap, mask, sink column, softmax, values), so float32 results stay
within rounding of ``generate()`` on the eager path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aioserve.runners.attention.layer_rules import LayerRules


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    """``[b, kv_heads, L, d]`` -> ``[b, kv_heads * groups, L, d]`` (each head repeated)."""
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
    """Eager attention of padded queries over gathered keys.

    Args:
        q: ``[b, q_heads, Q, k_dim]``.
        keys: ``[b, kv_heads, L, k_dim]``; values ``[b, kv_heads, L, v_dim]``.
        mask: ``[b, 1, Q, L]`` additive (0 / -inf), or None.
        rules: the layer's rules (scaling, soft-cap).
        sinks: ``[q_heads]`` sink logits, or None.

    Returns:
        ``[b, q_heads, Q, v_dim]`` in ``q``'s dtype.
    """
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
