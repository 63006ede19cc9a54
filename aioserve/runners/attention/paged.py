"""Paged attention for packed batches through transformers' ``AttentionInterface`` (the hook its
continuous batching uses): the reference path, exact on any device.

Each layer writes the step's K/V into the cache and attends each group over its own context only.
CPU float32 decode groups take the compiled kernel when loaded, else sparse kernels on a
head-major cache, else (narrow heads) two batched products. No mask function is registered, so
transformers builds no causal mask."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from aioserve.runners.attention import decode_gather as decode_attention
from aioserve.runners.attention import eager as eager_attention
from aioserve.runners.attention import layer_rules, sparse_decode
from aioserve.runners.attention.kv_gather import GatherBuffers, gather, gather_index, is_head_major
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.paged_metadata import AttentionGroup, PagedAttentionMetadata
from aioserve.runners.cpu import native_kernels

ATTENTION_NAME = "aioserve_paged"

def _in_place(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether a decode group reads the cache in place through the sparse kernels."""
    return (q.device.type == "cpu"
            and q.dtype == k_cache.dtype == v_cache.dtype == torch.float32
            and int(k_cache.shape[-1]) >= sparse_decode.MIN_HEAD_DIM
            and is_head_major(k_cache) and is_head_major(v_cache))


def _once_a_step(cache: dict[Any, Any], key: Any, build: Callable[[], Any]) -> Any:
    """``cache[key]``, built by the first layer that asks and read by the others."""
    value = cache.get(key)
    if value is None:
        value = cache[key] = build()
    return value


def _attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: AttentionGroup,
    scaling: float | None,
    block_size: int,
    rules: LayerRules | None = None,
    sinks: torch.Tensor | None = None,
    buffers: GatherBuffers | None = None,
) -> torch.Tensor:
    """One group: ``q`` ``[n, q_heads, k_dim]`` -> ``[n, q_heads, v_dim]``."""
    plain = rules is None or rules.plain
    kv_heads, rows = int(k_cache.shape[1]), int(k_cache.shape[0])
    if plain and group.seq_lens is not None:  # the metadata chose the compiled kernel
        return native_kernels.decode_attention(q, k_cache, v_cache, group.gather_blocks,
                                                 group.seq_lens, block_size, scaling)
    if plain and group.query_index is None and _in_place(q, k_cache, v_cache):
        heads = int(q.shape[1])
        sparse = _once_a_step(group.sparse_indices, (kv_heads, heads, rows), lambda: (
            sparse_decode.SparseDecodeIndex.build(group.gather_blocks, group.mask, block_size,
                                                  kv_heads, heads // kv_heads, rows)))
        return sparse_decode.sparse_decode_attention(q, k_cache, v_cache, sparse, scaling)
    batch, num_blocks = group.gather_blocks.shape
    length = num_blocks * block_size
    index = _once_a_step(group.gather_indices, (kv_heads, rows, k_cache.is_contiguous()),
                         lambda: gather_index(k_cache, group.gather_blocks.view(-1), block_size))
    keys = gather(k_cache, index, block_size, buffers, 0).reshape(kv_heads, batch, length, -1)
    values = gather(v_cache, index, block_size, buffers, 1).reshape(kv_heads, batch, length, -1)
    mask = group.mask
    if rules is not None and rules.window is not None:
        mask = group.window_masks[rules.window]
    if plain and group.query_index is None and q.device.type == "cpu" \
            and q.dtype == torch.float32 and keys.is_contiguous() and values.is_contiguous():
        bias = None if mask is None else _once_a_step(
            group.decode_biases, kv_heads, lambda: decode_attention.decode_bias(mask, kv_heads))
        return decode_attention.decode_attention(q, keys, values, bias, scaling)
    keys, values = keys.transpose(0, 1), values.transpose(0, 1)  # [b, kv_heads, L, dim]
    heads, dim = q.shape[1], q.shape[2]
    if group.query_index is None:
        q = q.unsqueeze(2)  # [b, q_heads, 1, k_dim]
    else:
        q = q.reshape(q.shape[0], heads * dim).index_select(0, group.query_index)
        q = q.view(batch, -1, heads, dim).transpose(1, 2)
    if rules is not None and (rules.softcap is not None or sinks is not None):
        out = eager_attention.attend(q, keys, values, mask, rules, sinks).transpose(1, 2)
    else:
        gqa = bool(heads != kv_heads)
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=scaling, enable_gqa=gqa
        ).transpose(1, 2)  # [b, Q, q_heads, v_dim]
    v_dim = int(v_cache.shape[-1])
    if group.query_valid is None:
        return out.squeeze(1)
    out = out.reshape(-1, heads * v_dim).index_select(0, group.query_valid)
    return out.view(-1, heads, v_dim)


def paged_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    paged_metadata: PagedAttentionMetadata | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention function: writes the step's K/V into the cache, then attends each
    group under the layer's rules. ``query`` ``[1, q_heads, T, k_dim]``, ``key``/``value`` ``[1,
    kv_heads, T, dim]`` -> ``([1, T, q_heads, v_dim], None)``; RuntimeError without the step's
    metadata."""
    rules = None
    if kwargs.get("sliding_window") or kwargs.get("softcap") or kwargs.get("s_aux") is not None \
            or key.shape[-1] != value.shape[-1]:
        rules = LayerRules.of_call(query, key, value, scaling, kwargs)
    meta = paged_metadata if paged_metadata is not None else layer_rules.CURRENT_METADATA.get()
    if meta is None:
        recorder = layer_rules.RECORDING.get()
        if recorder is None:
            raise RuntimeError(f"{ATTENTION_NAME} attention needs paged_metadata (use TorchRunner)")
        layer_rules.record(module, LayerRules.of_call(query, key, value, scaling, kwargs), recorder)
        shape = (1, query.shape[2], query.shape[1], value.shape[-1])
        return query.new_zeros(shape), None
    k_cache, v_cache = meta.kv_caches[module.layer_idx]
    k_cache.index_copy_(0, meta.slot_mapping, key[0].transpose(0, 1))
    v_cache.index_copy_(0, meta.slot_mapping, value[0].transpose(0, 1))
    q = query[0].transpose(0, 1)  # [T, q_heads, k_dim]
    out = attend_layer(scaling, rules, q, k_cache, v_cache, meta, kwargs.get("s_aux"))
    return out.unsqueeze(0), None


def attend_layer(
    scaling: float | None, rules: LayerRules | None, q: torch.Tensor, k_cache: torch.Tensor,
    v_cache: torch.Tensor, meta: PagedAttentionMetadata, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each group's attention: ``[T, q_heads, k_dim]`` -> ``[T, q_heads, v_dim]``; args first."""
    size = meta.block_size
    if len(meta.groups) == 1 and meta.groups[0].token_index is None:
        return _attend(q, k_cache, v_cache, meta.groups[0], scaling, size, rules, sinks,
                       meta.buffers)
    out = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1]))
    for group in meta.groups:
        assert group.token_index is not None
        part = q.index_select(0, group.token_index)
        out.index_copy_(
            0, group.token_index,
            _attend(part, k_cache, v_cache, group, scaling, size, rules, sinks, meta.buffers),
        )
    return out


def register() -> str:
    """Register the attention function (no mask function: transformers builds none); its name."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    return ATTENTION_NAME
