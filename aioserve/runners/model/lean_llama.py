"""The opt-in lean Llama forward (``--forward lean-llama``): transformers' arithmetic in fewer
Python calls, for small models on the CPU, where a step costs what its ops cost to launch.

Each element is computed by the same ops in the same order as transformers (float32 RMSNorm,
rotary, residuals, SiLU MLP), attention goes through the backend's seam, and the load checks the
logits equal transformers' bit for bit. q/k/v and gate/up are fused only on packed weights: there
a column's bits do not depend on fusion, while MKL's single-row kernel would sum in another
order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F

from aioserve.runners.attention.backend import AttentionBackend, LayerAttention
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.paged_metadata import PagedAttentionMetadata
from aioserve.runners.cpu import native_kernels
from aioserve.runners.cpu.packed_linear import (
    PackedLinear,
    PackedWeight,
    linear_pointwise,
    pack_weight,
)

_STATIC_ROPE = {"default", "linear", "llama3"}

#: One layer's weights: norm1, q/k/v (three, or one fused packed), o, norm2,
#: gate/up/down (three, or fused gate/up packed and down packed).
LayerWeights = tuple[torch.Tensor, tuple[PackedWeight, ...], PackedWeight, torch.Tensor,
                     tuple[PackedWeight, ...]]

#: ``F.linear`` for the dense weights of unpacked models, which :data:`LayerWeights` holds
#: as :data:`PackedWeight` (plain tensors there): the same function, typed once.
_dense_linear = cast(Callable[[torch.Tensor, PackedWeight], torch.Tensor], F.linear)


def supports(model: torch.nn.Module) -> bool:
    """True for a transformers Llama this forward reproduces."""
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
    """The step forward of a supported Llama over plain tensors."""

    def __init__(self, model: Any, backend: AttentionBackend,
                 rules: dict[int, LayerRules]) -> None:
        super().__init__()
        config = model.config
        inner = model.model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.embed = inner.embed_tokens.weight.detach()
        self.final_norm = inner.norm.weight.detach()
        self.packed = isinstance(model.lm_head, PackedLinear)
        self.lm_head: PackedWeight = (model.lm_head.packed if self.packed
                                      else model.lm_head.weight.detach())
        self.inv_freq = inner.rotary_emb.inv_freq.detach().float()
        self.rope_scaling = float(inner.rotary_emb.attention_scaling)
        self.layers = [self._layer(layer) for layer in inner.layers]
        # each layer's attention, bound once: no dispatch per layer in a step
        self.attention: list[LayerAttention] = [
            backend.layer_attention(rules[index]) for index in range(len(self.layers))]
        # rotation and cache writes in one compiled call (float32 or bfloat16 on the CPU)
        self.native = (self.embed.device.type == "cpu"
                       and self.embed.dtype in (torch.float32, torch.bfloat16)
                       and native_kernels.available())
        # bfloat16: each residual add and the RMSNorm after it in one compiled call, where it
        # gives torch's bits here
        norms = [self.final_norm, *(w for layer in self.layers for w in (layer[0], layer[3]))]
        self.fused_norm = (self.native and all(w.dtype == torch.bfloat16 for w in norms)
                           and self.embed.dtype == torch.bfloat16
                           and native_kernels.add_rms_norm_exact(int(self.embed.shape[1])))

    def _layer(self, layer: Any) -> LayerWeights:
        """One layer's weights; on packed models one weight for q/k/v and one for gate/up."""
        attn, mlp = layer.self_attn, layer.mlp
        norm1 = layer.input_layernorm.weight.detach()
        norm2 = layer.post_attention_layernorm.weight.detach()
        if not self.packed:
            return (norm1, tuple(m.weight.detach() for m in (attn.q_proj, attn.k_proj,
                                                             attn.v_proj)),
                    attn.o_proj.weight.detach(), norm2,
                    tuple(m.weight.detach() for m in (mlp.gate_proj, mlp.up_proj,
                                                      mlp.down_proj)))
        fused_qkv = pack_weight(torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                           attn.v_proj.weight]).detach())
        fused_gate_up = pack_weight(torch.cat([mlp.gate_proj.weight,
                                               mlp.up_proj.weight]).detach())
        return norm1, (fused_qkv,), attn.o_proj.packed, norm2, (fused_gate_up,
                                                                 mlp.down_proj.packed)

    def _linear(self, x: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
        return linear_pointwise(x, weight) if self.packed else _dense_linear(x, weight)

    def _qkv(self, h: torch.Tensor, weights: tuple[PackedWeight, ...]) -> tuple[torch.Tensor, ...]:
        """Queries and keys side by side ``[T, (heads + kv_heads) * head_dim]``, values."""
        if self.packed:
            qkv = linear_pointwise(h, weights[0])
            width = (self.heads + self.kv_heads) * self.head_dim
            return qkv[:, :width], qkv[:, width:]
        q_w, k_w, v_w = weights
        return (torch.cat((_dense_linear(h, q_w), _dense_linear(h, k_w)), dim=-1),
                _dense_linear(h, v_w))

    def _mlp(self, h: torch.Tensor, weights: tuple[PackedWeight, ...]) -> torch.Tensor:
        if self.packed:
            gate_up = linear_pointwise(h, weights[0])
            if self.native and h.dtype == torch.bfloat16:  # SiLU x up in one compiled call
                return linear_pointwise(native_kernels.silu_and_mul(gate_up), weights[1])
            width = gate_up.shape[1] // 2
            # A contiguous copy: SiLU's vectorised kernel, as unfused; then in place
            # (same kernels, same bits, two fewer temporaries).
            gate = F.silu(gate_up[:, :width].contiguous(), inplace=True)
            return linear_pointwise(gate.mul_(gate_up[:, width:]), weights[1])
        gate_w, up_w, down_w = weights
        return _dense_linear(F.silu(_dense_linear(h, gate_w)) * _dense_linear(h, up_w), down_w)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """LlamaRMSNorm; ``F.rms_norm`` for float32 on the CPU (the same ops)."""
        if x.dtype == torch.float32 and x.device.type == "cpu":
            return F.rms_norm(x, (x.shape[-1],), weight, self.eps)
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        return weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and signed sin ``[T, 1, head_dim]``: swapped halves times ``cat(-s1, s2)`` is
        exact."""
        freqs = positions[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.rope_scaling != 1.0:  # x * 1.0 == x: transformers' product changes nothing
            cos, sin = cos * self.rope_scaling, sin * self.rope_scaling
        if dtype != torch.float32:
            cos, sin = cos.to(dtype), sin.to(dtype)
        half = self.head_dim // 2
        signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        return cos.unsqueeze(1), signed_sin.unsqueeze(1)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor,
        meta: PagedAttentionMetadata,
    ) -> torch.Tensor:
        """Logits ``[S, vocab]`` of the ``keep`` indices of the step's ``[T]`` tokens."""
        x = F.embedding(input_ids, self.embed)  # [T, hidden]
        cos, signed_sin = self._rope(position_ids, x.dtype)
        half = self.head_dim // 2
        slot_mapping = meta.slot_mapping
        fused = self.fused_norm
        if fused:
            x, h = native_kernels.add_rms_norm(x, None, self.layers[0][0], self.eps)
        last = len(self.layers) - 1
        for index, (norm1, qkv_w, o_w, norm2, mlp_w) in enumerate(self.layers):
            attend = self.attention[index]
            if not fused:
                h = self._rms_norm(x, norm1)
            qk, v = self._qkv(h, qkv_w)
            qk = qk.unflatten(1, (-1, self.head_dim))
            v = v.unflatten(1, (-1, self.head_dim))
            k_cache, v_cache = meta.kv_caches[index]
            if self.native:
                q = native_kernels.rope_and_cache(qk, v, cos, signed_sin, slot_mapping,
                                                  k_cache, v_cache, self.heads)
            else:
                swapped = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)
                qk = (qk * cos) + (swapped * signed_sin)  # transformers' rotation, bit for bit
                q, k = qk[:, : self.heads], qk[:, self.heads :]
                k_cache.index_copy_(0, slot_mapping, k)
                v_cache.index_copy_(0, slot_mapping, v)
            attn = attend(q, k_cache, v_cache, meta)
            if fused:  # the residual add and the next norm in one call
                x, h = native_kernels.add_rms_norm(x, self._linear(attn.flatten(1), o_w), norm2,
                                                   self.eps)
                following = self.final_norm if index == last else self.layers[index + 1][0]
                x, h = native_kernels.add_rms_norm(x, self._mlp(h, mlp_w), following, self.eps)
                continue
            x = x + self._linear(attn.flatten(1), o_w)
            h = self._rms_norm(x, norm2)
            x = x + self._mlp(h, mlp_w)
        kept = (h if fused else self._rms_norm(x, self.final_norm)).index_select(0, keep)
        return self._linear(kept, self.lm_head)


def lean_forward(
    model: Any, backend: AttentionBackend, rules: dict[int, LayerRules],
    probe: Callable[[LeanLlama | None], list[torch.Tensor]],
) -> LeanLlama:
    """The lean forward of ``model`` if ``probe`` gives transformers' logits bit for bit."""
    if not (supports(model) and all(layer.plain for layer in rules.values())):
        raise ValueError(
            "forward: lean-llama needs a Llama model (no projection biases, SiLU, a static "
            "rotary embedding, plain attention layers); use --forward transformers"
        )
    lean = LeanLlama(model, backend, rules)
    want, got = probe(None), probe(lean)
    if not all(torch.equal(a, b) for a, b in zip(want, got)):
        raise ValueError("forward: lean-llama's logits differ from transformers' on this "
                         "model; use --forward transformers")
    if lean.packed:  # its fused copies replace the layers' own: keep one packed copy
        for layer in model.model.layers:
            for module in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                           layer.self_attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj):
                module.release()
    return lean
