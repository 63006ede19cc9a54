"""The attention-backend seam: what the runner asks of an attention implementation.

A backend (like vLLM's attention backends) builds the step's metadata once,
attends one layer over the paged cache, and says which layer rules it supports;
the runner refuses at load a model with a layer the backend cannot serve
exactly. :class:`ReferenceBackend` is the exact one, on any device: plain layers
through ``scaled_dot_product_attention`` (plus a CPU decode fast path), sliding
windows through per-window masks, soft-cap and sinks in eager math, K and V of
their own widths.

Transformers reaches a backend through the attention function registered under
:attr:`AttentionBackend.attention_name`; the layer's rules come with each call
(:class:`~aioserve.runners.model.layer_rules.LayerRules`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from aioserve.runners.attention import paged as attention
from aioserve.runners.attention import paged_metadata
from aioserve.runners.attention.kv_gather import GatherBuffers
from aioserve.runners.attention.paged_metadata import PagedAttentionMetadata
from aioserve.runners.cpu import native_kernels
from aioserve.runners.model.layer_rules import LayerRules


class AttentionBackend(Protocol):
    """What the runner needs from an attention implementation."""

    attention_name: str

    def register(self) -> str:
        """Register the attention function with transformers; returns its name."""
        ...

    def unsupported(self, rules: LayerRules) -> str | None:
        """Why a layer with ``rules`` cannot be served exactly, or None."""
        ...

    def build_metadata(
        self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        start_positions: list[int] | np.ndarray, num_new_tokens: list[int] | np.ndarray,
        block_tables: list[list[int]] | np.ndarray, block_size: int,
        device: torch.device, windows: tuple[int, ...],
    ) -> tuple[PagedAttentionMetadata, torch.Tensor]:
        """The step's metadata and packed position ids ``[T]`` int64, built once."""
        ...

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: PagedAttentionMetadata, rules: LayerRules, sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        """One layer: ``q`` ``[T, q_heads, k_dim]`` (the step's K/V already in the
        cache) -> ``[T, q_heads, v_dim]``."""
        ...


def uneven_heads(rules: LayerRules) -> str | None:
    """Why no backend can serve a layer whose query heads do not share its KV heads
    evenly (grouped-query attention needs a whole group per KV head), or None."""
    if rules.q_heads % rules.kv_heads:
        return f"{rules.q_heads} query heads do not share {rules.kv_heads} KV heads evenly"
    return None


class ReferenceBackend:
    """The exact backend: every rule of :class:`LayerRules`, on any device. Its
    layers gather blocks into buffers it keeps (:class:`GatherBuffers`), so one
    backend serves one runner, whose steps run one after another."""

    attention_name = attention.ATTENTION_NAME

    def __init__(self) -> None:
        self.buffers = GatherBuffers()

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
        # plain float32 layers on the CPU decode through the compiled kernel when it is
        # loaded (windowed models keep the masked paths)
        native = (device.type == "cpu" and not windows
                  and kv_caches[0][0].dtype == torch.float32 and native_kernels.available())
        return paged_metadata.build_metadata(
            kv_caches, start_positions, num_new_tokens, block_tables, block_size, device,
            windows=windows, buffers=self.buffers, native_decode=native,
        )

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: PagedAttentionMetadata, rules: LayerRules, sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        layer = None if rules.plain else rules
        return attention.attend_groups(q, k_cache, v_cache, meta, rules.scaling, layer, sinks)


#: The names :func:`backend_for` knows.
BACKEND_NAMES = ("reference", "flex")


def backend_for(name: str, device: torch.device) -> AttentionBackend:
    """The attention backend called ``name`` for ``device``: ``"reference"`` (exact,
    any device) or ``"flex"`` (FlexAttention; compiled on CUDA, unfused on the CPU).

    Raises:
        ValueError: an unknown name, or ``"flex"`` where it cannot run.
    """
    if name == "reference":
        return ReferenceBackend()
    if name != "flex":
        raise ValueError(f"attention backend: {name!r} is not one of {', '.join(BACKEND_NAMES)}")
    from aioserve.runners.attention.flex.backend import FlexBackend

    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"attention backend 'flex' runs on cuda or cpu, not {device.type}")
    if not torch._dynamo.is_dynamo_supported():
        raise ValueError("attention backend 'flex' needs torch.compile (dynamo), "
                         "which this Python/torch does not support")
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise ValueError("attention backend 'flex' on cuda needs Triton (not installed)")
    return FlexBackend(device)
