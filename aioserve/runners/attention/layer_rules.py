"""Each attention layer's own rules, as the model states them when it calls attention.

A transformers model calls its attention function with the layer's query, key and
value and keyword arguments that carry the layer's rules: ``scaling``,
``sliding_window`` (mistral, gemma2/3, gpt_oss, cohere2, starcoder2: a query at
position p sees keys k with ``p - window < k <= p``), ``softcap`` (gemma2:
``tanh(scores / softcap) * softcap`` before the mask) and ``s_aux`` (gpt_oss: one
learned sink logit per head, a softmax column dropped afterwards). K and V widths
come from the tensors themselves (MLA models such as deepseek_v3 have narrower V).

:func:`discover` runs the model once on two tokens with a recording attention
(no cache needed), so the runner learns every layer's rules before it sizes the KV
cache. The step's metadata reaches the attention function through a context
variable as well as through keyword arguments, for models that drop kwargs on the
way to their attention (stablelm).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

#: The step's metadata, for models that do not pass kwargs down to attention.
CURRENT_METADATA: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "aioserve_paged_metadata", default=None
)

#: Set while :func:`discover` runs: layer index -> its rules.
RECORDING: contextvars.ContextVar[dict[int, LayerRules] | None] = contextvars.ContextVar(
    "aioserve_layer_rules", default=None
)


@dataclass(frozen=True)
class LayerRules:
    """One attention layer's rules.

    Attributes:
        q_heads, kv_heads: query and key/value heads.
        k_dim, v_dim: key (and query) and value head widths.
        scaling: score scale (None: ``k_dim ** -0.5``).
        window: sliding window in tokens, or None for full causal attention.
        softcap: logit soft-cap, or None.
        sinks: the layer has per-head attention sinks.
    """

    q_heads: int
    kv_heads: int
    k_dim: int
    v_dim: int
    scaling: float | None
    window: int | None
    softcap: float | None
    sinks: bool

    @property
    def plain(self) -> bool:
        """No window, soft-cap or sinks, and equal K/V widths (the fast paths' case)."""
        return (self.window is None and self.softcap is None and not self.sinks
                and self.k_dim == self.v_dim)

    @classmethod
    def of_call(
        cls, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        scaling: float | None, kwargs: dict[str, Any],
    ) -> LayerRules:
        """The rules of one attention call (query ``[1, H, T, Dk]``, key ``[1, KV, T, Dk]``,
        value ``[1, KV, T, Dv]``)."""
        window = kwargs.get("sliding_window")
        softcap = kwargs.get("softcap")
        return cls(
            int(query.shape[1]), int(key.shape[1]), int(key.shape[-1]), int(value.shape[-1]),
            None if scaling is None else float(scaling),
            int(window) if window else None,
            float(softcap) if softcap else None,
            kwargs.get("s_aux") is not None,
        )


@contextmanager
def metadata_context(meta: Any) -> Iterator[None]:
    """Make ``meta`` the step's metadata for attention calls in this context."""
    token = CURRENT_METADATA.set(meta)
    try:
        yield
    finally:
        CURRENT_METADATA.reset(token)


def record(module: torch.nn.Module, rules: LayerRules, recorder: dict[int, LayerRules]) -> None:
    """Note ``rules`` for ``module``'s layer during :func:`discover`.

    Raises:
        ValueError: the attention module has no ``layer_idx``.
    """
    index = getattr(module, "layer_idx", None)
    if index is None:
        raise ValueError(f"{type(module).__name__} has no layer_idx: cannot map it to a KV cache")
    recorder[int(index)] = rules


def discover(model: torch.nn.Module, device: torch.device) -> dict[int, LayerRules]:
    """Every layer's rules, from one forward over two tokens with recording attention
    (which returns zeros and writes nothing). Layers missing from the result compute
    attention without transformers' attention interface."""
    recorder: dict[int, LayerRules] = {}
    token = RECORDING.set(recorder)
    try:
        ids = torch.tensor([[1, 1]], dtype=torch.int64, device=device)
        with torch.inference_mode():
            model(input_ids=ids, position_ids=torch.arange(2, device=device)[None],
                  use_cache=False)
    finally:
        RECORDING.reset(token)
    return recorder
