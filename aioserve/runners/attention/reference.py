"""ReferenceBackend: the exact attention backend on any device (see :mod:`.paged`)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from aioserve.runners.attention import paged as attention
from aioserve.runners.attention import paged_metadata
from aioserve.runners.attention.backend import LayerAttention, uneven_heads
from aioserve.runners.attention.kv_gather import GatherBuffers
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.paged_metadata import PagedAttentionMetadata
from aioserve.runners.batch_invariance import BatchInvariance
from aioserve.runners.cpu import native_kernels

__all__ = ["NATIVE_DECODE_DTYPES", "ReferenceBackend"]

#: KV cache dtypes the compiled decode kernel reads (bfloat16 widened to float32 exactly).
NATIVE_DECODE_DTYPES = (torch.float32, torch.bfloat16)


class ReferenceBackend:
    """Every rule of :class:`LayerRules`, any device; one backend per runner (it owns buffers)."""

    attention_name = attention.ATTENTION_NAME
    head_major = True

    def __init__(self, invariance: BatchInvariance | None = None) -> None:
        self.buffers = GatherBuffers()
        self.min_context = (invariance or BatchInvariance()).min_context_width

    def register(self) -> str:
        return attention.register()

    def unsupported(self, rules: LayerRules) -> str | None:
        return uneven_heads(rules)

    def build_metadata(
        self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        start_positions: list[int] | np.ndarray, num_new_tokens: list[int] | np.ndarray,
        block_tables: list[list[int]] | np.ndarray, block_size: int,
        device: torch.device, windows: tuple[int, ...],
    ) -> tuple[PagedAttentionMetadata, torch.Tensor]:
        # plain float32 or bfloat16 layers on the CPU decode through the compiled kernel when
        # it is loaded (windowed models keep the masked paths)
        native = (device.type == "cpu" and not windows
                  and kv_caches[0][0].dtype in NATIVE_DECODE_DTYPES
                  and native_kernels.available())
        return paged_metadata.build_metadata(
            kv_caches, start_positions, num_new_tokens, block_tables, block_size, device,
            windows=windows, buffers=self.buffers, native_decode=native,
            min_context=self.min_context,
        )

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: PagedAttentionMetadata, rules: LayerRules, sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        layer = None if rules.plain else rules
        return attention.attend_layer(rules.scaling, layer, q, k_cache, v_cache, meta, sinks)

    def layer_attention(self, rules: LayerRules) -> LayerAttention:
        # positional arguments only: the partial costs what a direct call does
        return functools.partial(attention.attend_layer, rules.scaling,
                                 None if rules.plain else rules)
