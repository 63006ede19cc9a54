"""FlexBackend: torch's FlexAttention over the paged KV cache (arXiv:2412.05496), compiled on
CUDA into kernels reading the cache in place; windows as mask functions, soft-cap as a score
function. Unfused on the CPU it materialises ``[b, heads, Q, S]`` scores over the whole cache:
tests only."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention.flex_attention import flex_attention
from transformers import AttentionInterface

from aioserve.runners.attention import layer_rules
from aioserve.runners.attention import paged as attention
from aioserve.runners.attention.backend import LayerAttention, uneven_heads
from aioserve.runners.attention.flex import metadata as flex_metadata
from aioserve.runners.attention.flex.metadata import FlexGroup, FlexMetadata
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.paged_metadata import PagedAttentionMetadata

ATTENTION_NAME = "aioserve_flex"

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                    torch.Tensor]


@functools.cache
def softcap_mod(cap: float) -> ScoreMod:
    """The soft-cap score function (one object per cap)."""

    def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                  kv: torch.Tensor) -> torch.Tensor:
        return torch.tanh(score / cap) * cap

    return score_mod


@functools.cache
def flex_function(device_type: str) -> Callable[..., Any]:
    """``flex_attention``, compiled (``fullgraph``) on CUDA."""
    if device_type == "cuda":
        return torch.compile(flex_attention, fullgraph=True)
    return flex_attention


def _attend_group(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, group: FlexGroup,
    rules: LayerRules, block_size: int,
) -> torch.Tensor:
    heads, dim = int(q.shape[1]), int(q.shape[2])
    if group.query_index is None:
        batch = q.unsqueeze(2)  # [b, heads, 1, k_dim]
    else:
        batch = q.index_select(0, group.query_index).view(group.size, group.q_len, heads, dim)
        batch = batch.transpose(1, 2)
    options = {"BLOCK_N": min(block_size, 64)} if q.device.type == "cuda" else None
    out: torch.Tensor = flex_function(q.device.type)(
        batch, keys, values,
        score_mod=None if rules.softcap is None else softcap_mod(rules.softcap),
        block_mask=group.masks[rules.window],
        scale=rules.scaling if rules.scaling is not None else rules.k_dim**-0.5,
        enable_gqa=heads != int(keys.shape[1]), kernel_options=options,
    ).transpose(1, 2)  # [b, q_len, heads, v_dim]
    if group.query_valid is None:
        return out.squeeze(1)
    return out.reshape(-1, heads, out.shape[-1]).index_select(0, group.query_valid)


def attend(
    rules: LayerRules, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: FlexMetadata,
) -> torch.Tensor:
    """One layer (K/V cached): ``[T, q_heads, k_dim]`` -> ``[T, q_heads, v_dim]``; ``rules``
    first."""
    keys = k_cache.permute(1, 0, 2).unsqueeze(0)  # [1, kv_heads, S, k_dim], a view
    values = v_cache.permute(1, 0, 2).unsqueeze(0)
    size = meta.block_size
    groups = meta.flex_groups
    if len(groups) == 1 and groups[0].token_index is None:
        return _attend_group(q, keys, values, groups[0], rules, size)
    out = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1]))
    for group in groups:
        assert group.token_index is not None
        part = q.index_select(0, group.token_index)
        out.index_copy_(0, group.token_index, _attend_group(part, keys, values, group, rules, size))
    return out


def flex_paged_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
    paged_metadata: PagedAttentionMetadata | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Registered as :data:`ATTENTION_NAME`; without :class:`FlexMetadata` the reference answers."""
    meta = paged_metadata if paged_metadata is not None else layer_rules.CURRENT_METADATA.get()
    if not isinstance(meta, FlexMetadata):
        return attention.paged_attention(module, query, key, value, attention_mask, scaling,
                                         dropout, paged_metadata, **kwargs)
    if kwargs.get("s_aux") is not None:
        raise ValueError("flex backend: attention sinks are not supported")
    rules = LayerRules.of_call(query, key, value, scaling, kwargs)
    k_cache, v_cache = meta.kv_caches[module.layer_idx]
    k_cache.index_copy_(0, meta.slot_mapping, key[0].transpose(0, 1))
    v_cache.index_copy_(0, meta.slot_mapping, value[0].transpose(0, 1))
    out = attend(rules, query[0].transpose(0, 1), k_cache, v_cache, meta)
    return out.unsqueeze(0), None


class FlexBackend:
    """The FlexAttention backend for ``device``."""

    attention_name = ATTENTION_NAME
    head_major = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @classmethod
    def for_device(cls, device: torch.device) -> FlexBackend:
        """The backend for ``device``; ValueError where dynamo or (on CUDA) Triton is missing."""
        if device.type not in ("cuda", "cpu"):
            raise ValueError(f"attention backend 'flex' runs on cuda or cpu, not {device.type}")
        from torch._dynamo.eval_frame import is_dynamo_supported

        if not is_dynamo_supported():
            raise ValueError("attention backend 'flex' needs torch.compile (dynamo), "
                             "which this Python/torch does not support")
        if device.type == "cuda":
            from torch.utils._triton import has_triton

            if not has_triton():
                raise ValueError("attention backend 'flex' on cuda needs Triton (not installed)")
        return cls(device)

    def register(self) -> str:
        AttentionInterface.register(ATTENTION_NAME, flex_paged_attention)
        return ATTENTION_NAME

    def unsupported(self, rules: LayerRules) -> str | None:
        if (uneven := uneven_heads(rules)) is not None:
            return uneven
        if rules.sinks:
            return "attention sinks: flex's score function cannot add a sink to the softmax"
        if rules.k_dim != rules.v_dim:
            return f"K width {rules.k_dim} differs from V width {rules.v_dim} (flex backend)"
        if self.device.type == "cuda" and rules.k_dim < 16:
            return f"head width {rules.k_dim} < 16, below the Triton flex kernels' tiles"
        return None

    build_metadata = staticmethod(flex_metadata.build_metadata)
    decode_metadata = staticmethod(flex_metadata.decode_metadata)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: PagedAttentionMetadata, rules: LayerRules, sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        """See :func:`attend`; TypeError without :class:`FlexMetadata`, ValueError with sinks."""
        if not isinstance(meta, FlexMetadata):
            raise TypeError("FlexBackend.attend needs FlexMetadata (FlexBackend.build_metadata)")
        if sinks is not None:
            raise ValueError("flex backend: attention sinks are not supported")
        return attend(rules, q, k_cache, v_cache, meta)

    def layer_attention(self, rules: LayerRules) -> LayerAttention:
        return functools.partial(attend, rules)
