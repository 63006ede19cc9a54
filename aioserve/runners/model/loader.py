"""Loading a model for paged attention: adapters, refusals, per-layer rules, KV cache."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from aioserve.errors import UnsupportedModelError
from aioserve.model_path import check_model_path
from aioserve.runners.attention import layer_rules
from aioserve.runners.attention.backend import AttentionBackend
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.cpu import packed_linear
from aioserve.runners.model import adapters as model_adapters

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def weights_bar() -> Iterator[None]:
    """transformers' "Loading weights" bar only where aioserve logs at debug level."""
    from transformers.utils import logging as hf_logging

    if logger.isEnabledFor(logging.DEBUG) or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_model(
    path: str, dtype: torch.dtype, device: torch.device, backend: AttentionBackend
) -> tuple[PreTrainedModel, dict[int, LayerRules]]:
    """The model (eval, on ``device``, attention through ``backend``, packed linear weights where
    available) and its layers' rules by index.

    Raises:
        OSError: the model cannot be loaded (a missing directory is named as such).
        UnsupportedModelError: ALiBi, layers bypassing the attention interface, or a rule
            ``backend`` does not support."""
    check_model_path(path)
    name = backend.register()
    hf_config = AutoConfig.from_pretrained(path)
    model_adapters.check_config(hf_config.get_text_config())
    model_adapters.prepare(hf_config, name)
    with weights_bar():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                     attn_implementation=name)
    # transformers' decorated PreTrainedModel.to is typed as taking a model
    model = model.to(device).eval()  # type: ignore[arg-type]
    if packed_linear.available(device, dtype, packed_linear.linear_parameters(model)):
        packed_linear.pack_linears(model)
    text_config = model.config.get_text_config()
    model_type = str(text_config.model_type)
    rules = layer_rules.discover(model, device)
    model_adapters.check_coverage(model_type, int(text_config.num_hidden_layers), rules)
    for index, layer in sorted(rules.items()):
        reason = backend.unsupported(layer)
        if reason is not None:
            raise UnsupportedModelError(f"{model_type} layer {index}: {reason}")
    return model, rules


def context_length(text_config: Any) -> int:
    """The model's ``max_position_embeddings``; UnsupportedModelError when unstated."""
    length = getattr(text_config, "max_position_embeddings", None)
    if length is None:
        raise UnsupportedModelError(
            f"{getattr(text_config, 'model_type', '?')} states no max_position_embeddings: "
            "set EngineConfig.max_model_len"
        )
    return int(length)


def kv_bytes_per_token(rules: dict[int, LayerRules], dtype: torch.dtype) -> int:
    """Bytes one token's K and V take over all layers, each at its own widths."""
    element = torch.tensor([], dtype=dtype).element_size()
    return element * sum(r.kv_heads * (r.k_dim + r.v_dim) for r in rules.values())


def allocate_kv_cache(
    rules: dict[int, LayerRules], rows: int, dtype: torch.dtype, device: torch.device,
    head_major: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, zeroed K ``[rows, kv_heads, k_dim]`` and V ``[rows, kv_heads, v_dim]``."""

    def zeros(heads: int, dim: int) -> torch.Tensor:
        if head_major:
            return torch.zeros((heads, rows, dim), dtype=dtype, device=device).transpose(0, 1)
        return torch.zeros((rows, heads, dim), dtype=dtype, device=device)

    return [
        (zeros(r.kv_heads, r.k_dim), zeros(r.kv_heads, r.v_dim))
        for r in (rules[index] for index in range(len(rules)))
    ]
