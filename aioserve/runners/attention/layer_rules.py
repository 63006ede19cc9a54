"""Each attention layer's rules as the model states them when it calls attention (``scaling``,
``sliding_window``, ``softcap``, ``s_aux`` sinks, K/V widths). :func:`discover` records them on
one two-token forward before the KV cache is sized; the step's metadata also travels by context
variable for models dropping kwargs (stablelm)."""

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
    """One attention layer's rules (``scaling`` None: ``k_dim ** -0.5``)."""

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
        """The rules of one call (query ``[1, H, T, Dk]``, value ``[1, KV, T, Dv]``)."""
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
    token = CURRENT_METADATA.set(meta)
    try:
        yield
    finally:
        CURRENT_METADATA.reset(token)


def record(module: torch.nn.Module, rules: LayerRules, recorder: dict[int, LayerRules]) -> None:
    """Note ``rules`` for ``module``'s layer; ValueError without ``layer_idx``."""
    index = getattr(module, "layer_idx", None)
    if index is None:
        raise ValueError(f"{type(module).__name__} has no layer_idx: cannot map it to a KV cache")
    recorder[int(index)] = rules


def discover(model: torch.nn.Module, device: torch.device) -> dict[int, LayerRules]:
    """Every layer's rules from one recording two-token forward."""
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
