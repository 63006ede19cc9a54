"""What a model needs before paged attention can serve it, or why it cannot (refused, never
wrong)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from aioserve.errors import UnsupportedModelError
from aioserve.runners.attention.layer_rules import LayerRules

if TYPE_CHECKING:
    from transformers.models.falcon.modeling_falcon import FalconAttention

#: model_type -> why it cannot be served.
REFUSED = {
    "bloom": "bloom computes ALiBi attention itself and bypasses transformers' attention "
             "interface, so the paged KV cache would be ignored",
    "mpt": "mpt computes ALiBi attention itself and bypasses transformers' attention "
           "interface, so the paged KV cache would be ignored",
}


def check_config(config: Any) -> None:
    """Refuse a model known to bypass the attention interface, before loading."""
    model_type = getattr(config, "model_type", "?")
    if model_type in REFUSED:
        raise UnsupportedModelError(REFUSED[model_type])
    if getattr(config, "alibi", False):
        raise UnsupportedModelError(
            f"{model_type} with alibi=True computes ALiBi attention itself and bypasses "
            "transformers' attention interface"
        )


def prepare(config: Any, attention_name: str) -> None:
    """Register what ``config``'s architecture needs to load with ``attention_name``."""
    if getattr(config, "model_type", None) == "falcon":
        from transformers.models.falcon import modeling_falcon

        # private to transformers (gone in 5.25, where falcon reaches the interface)
        table = getattr(modeling_falcon, "FALCON_ATTENTION_CLASSES", None)
        if isinstance(table, dict):
            table.setdefault(attention_name, _paged_falcon_attention(modeling_falcon))


def _paged_falcon_attention(modeling_falcon: Any) -> type[FalconAttention]:
    """A ``FalconAttention`` attending through the paged attention."""
    from transformers import AttentionInterface

    class PagedFalconAttention(modeling_falcon.FalconAttention):  # type: ignore[misc]
        def forward(
            self, hidden_states: torch.Tensor, alibi: torch.Tensor | None,
            attention_mask: torch.Tensor | None, position_ids: Any = None,
            layer_past: Any = None, use_cache: bool = False, output_attentions: bool = False,
            position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, **kwargs: Any,
        ) -> tuple[torch.Tensor, None]:
            query, key, value = self._split_heads(self.query_key_value(hidden_states))
            batch, length = query.shape[:2]
            kv_heads = self.num_heads if self.new_decoder_architecture else self.num_kv_heads
            query = query.transpose(1, 2).reshape(batch, self.num_heads, length, self.head_dim)
            key = key.transpose(1, 2).reshape(batch, kv_heads, length, self.head_dim)
            value = value.transpose(1, 2).reshape(batch, kv_heads, length, self.head_dim)
            assert position_embeddings is not None  # rotary falcon (ALiBi is refused)
            cos, sin = position_embeddings
            query, key = modeling_falcon.apply_rotary_pos_emb(query, key, cos, sin)
            attend = AttentionInterface()[self.config._attn_implementation]
            out, _ = attend(self, query, key, value, None, scaling=1 / math.sqrt(self.head_dim))
            return self.dense(out.reshape(batch, length, self.num_heads * self.head_dim)), None

    return PagedFalconAttention


def check_coverage(model_type: str, num_layers: int, rules: dict[int, LayerRules]) -> None:
    """Refuse a model some of whose layers never called the attention interface."""
    missing = sorted(set(range(num_layers)) - set(rules))
    if missing:
        raise UnsupportedModelError(
            f"{model_type}: layers {missing} compute attention themselves and bypass "
            "transformers' attention interface, so the paged KV cache would be ignored"
        )
