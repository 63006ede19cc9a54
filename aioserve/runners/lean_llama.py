"""The opt-in lean forward for Llama-architecture checkpoints (``--forward lean-llama``):
transformers' arithmetic in fewer Python calls, for small models on the CPU.

transformers' ``LlamaForCausalLM`` is written for every use (training, caches,
tensor parallelism): module calls, decorators and config look-ups around a few
hundred aten ops per step. On the CPU a small model's step costs what its ops cost
to launch from Python, so this forward runs the same computation with fewer ops and
no module calls: the rotary embedding applied to queries and keys together, views
without shape arithmetic, and aioserve's paged attention called directly. (The
q/k/v projections stay three matrix products: fused into one, MKL's single-row
kernel sums in another order and the logits are no longer bitwise transformers'.)

Every element is computed by the same operations in the same order as in
transformers (RMSNorm in float32, ``q * cos + rotate_half(q) * sin``, residual
adds, SiLU-gated MLP), and the runner checks at load that its logits equal the
model's own bit for bit on a probe step (else it keeps transformers' forward).
Supported: ``model_type == "llama"`` without projection biases, SiLU activation, a
static rotary embedding and plain attention layers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from aioserve.runners.attention import attend_groups
from aioserve.runners.paged_metadata import PagedAttentionMetadata

_STATIC_ROPE = {"default", "linear", "llama3"}


def supports(model: torch.nn.Module) -> bool:
    """True for a transformers Llama model this forward reproduces."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    return (
        config is not None
        and getattr(config, "model_type", None) == "llama"
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "hidden_act", None) == "silu"
        and getattr(config, "pretraining_tp", 1) == 1
        and getattr(rotary, "rope_type", None) in _STATIC_ROPE
        and hasattr(model, "lm_head")
    )


class LeanLlama(torch.nn.Module):
    """The step forward of a supported Llama model over plain tensors.

    Args:
        model: a transformers ``LlamaForCausalLM`` (see :func:`supports`).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        config = model.config
        inner = model.model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        self.embed = inner.embed_tokens.weight.detach()
        self.final_norm = inner.norm.weight.detach()
        self.lm_head = model.lm_head.weight.detach()
        self.inv_freq = inner.rotary_emb.inv_freq.detach().float()
        self.rope_scaling = float(inner.rotary_emb.attention_scaling)
        self.layers = [self._layer(layer) for layer in inner.layers]
        self.scaling = float(inner.layers[0].self_attn.scaling)

    @staticmethod
    def _layer(layer: torch.nn.Module) -> tuple[torch.Tensor, ...]:
        attn, mlp = layer.self_attn, layer.mlp
        modules = (
            layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
            layer.post_attention_layernorm, mlp.gate_proj, mlp.up_proj, mlp.down_proj,
        )
        return tuple(module.weight.detach() for module in modules)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """transformers' LlamaRMSNorm, op for op (float32 statistics; the casts, no-ops
        for a float32 model, are left out of its trace)."""
        if x.dtype == torch.float32:
            return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        return weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos, sin ``[T, 1, head_dim]`` as transformers' LlamaRotaryEmbedding makes them."""
        freqs = positions[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.rope_scaling != 1.0:  # x * 1.0 == x: transformers' product changes nothing
            cos, sin = cos * self.rope_scaling, sin * self.rope_scaling
        if dtype != torch.float32:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor,
        meta: PagedAttentionMetadata,
    ) -> torch.Tensor:
        """Logits ``[S, vocab]`` of the kept tokens.

        Args:
            input_ids, position_ids: ``[T]`` int64, the step's packed tokens.
            keep: ``[S]`` int64, the packed indices whose logits are wanted.
            meta: the step's paged-attention metadata (its KV caches are written).
        """
        x = F.embedding(input_ids, self.embed)  # [T, hidden]
        cos, sin = self._rope(position_ids, x.dtype)
        half = self.head_dim // 2
        slot_mapping = meta.slot_mapping
        for index, (norm1, q_w, k_w, v_w, o_w, norm2, gate_w, up_w, down_w) in enumerate(
            self.layers
        ):
            h = self._rms_norm(x, norm1)
            qk = torch.cat((F.linear(h, q_w), F.linear(h, k_w)), dim=-1)
            qk = qk.unflatten(1, (-1, self.head_dim))
            rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = (qk * cos) + (rotated * sin)
            q, k = qk[:, : self.heads], qk[:, self.heads :]
            v = F.linear(h, v_w).unflatten(1, (-1, self.head_dim))
            k_cache, v_cache = meta.kv_caches[index]
            k_cache.index_copy_(0, slot_mapping, k)
            v_cache.index_copy_(0, slot_mapping, v)
            attn = attend_groups(q, k_cache, v_cache, meta, self.scaling)
            x = x + F.linear(attn.flatten(1), o_w)
            h = self._rms_norm(x, norm2)
            x = x + F.linear(F.silu(F.linear(h, gate_w)) * F.linear(h, up_w), down_w)
        kept = self._rms_norm(x, self.final_norm).index_select(0, keep)
        return F.linear(kept, self.lm_head)


def lean_forward(
    model: torch.nn.Module, all_plain: bool,
    probe: Callable[[LeanLlama | None], list[torch.Tensor]],
) -> LeanLlama:
    """The lean forward of ``model``, checked: ``probe(forward)`` runs the same probe
    steps through transformers' forward (None) or the lean one and returns the logits;
    the lean forward is returned only if they are equal bit for bit.

    Raises:
        ValueError: the model is not a supported Llama (``forward``), or the lean
            forward's logits differ from transformers' on the probe.
    """
    if not (supports(model) and all_plain):
        raise ValueError(
            "forward: lean-llama needs a Llama model (no projection biases, SiLU, a static "
            "rotary embedding, plain attention layers); use --forward transformers"
        )
    lean = LeanLlama(model)
    want, got = probe(None), probe(lean)
    if not all(torch.equal(a, b) for a, b in zip(want, got)):
        raise ValueError("forward: lean-llama's logits differ from transformers' on this "
                         "model; use --forward transformers")
    return lean
