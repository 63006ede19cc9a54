"""The attention-backend seam: what any forward asks of an attention implementation.

A backend (as vLLM's) builds the step's metadata once, attends one layer over the paged cache,
and says which layer rules it supports, so the runner refuses at load a layer it cannot serve
exactly. transformers' forward reaches it through the function registered under
:attr:`AttentionBackend.attention_name`; the lean forward through
:meth:`AttentionBackend.layer_attention`, bound per layer at load so a step pays no dispatch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.paged_metadata import PagedAttentionMetadata

__all__ = ["AttentionBackend", "LayerAttention", "uneven_heads"]

#: One layer's attention bound to its rules: ``(q [T, q_heads, k_dim], k_cache, v_cache,
#: metadata) -> [T, q_heads, v_dim]``, the step's K/V already written to the cache.
LayerAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PagedAttentionMetadata],
                          torch.Tensor]


class AttentionBackend(Protocol):
    """What the runner and every forward need from an attention implementation.

    Attributes:
        attention_name: the name transformers' ``AttentionInterface`` knows it by.
        head_major: whether it wants the CPU KV cache head-major."""

    attention_name: str
    head_major: bool

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
        """One layer, K/V already cached: ``q`` ``[T, q_heads, k_dim]`` -> ``[T, q_heads,
        v_dim]``."""
        ...

    def layer_attention(self, rules: LayerRules) -> LayerAttention:
        """:meth:`attend` for a layer with ``rules`` (no sinks), bound once at load."""
        ...


def uneven_heads(rules: LayerRules) -> str | None:
    """Why no backend can serve query heads that do not share the KV heads evenly, or None."""
    if rules.q_heads % rules.kv_heads:
        return f"{rules.q_heads} query heads do not share {rules.kv_heads} KV heads evenly"
    return None
