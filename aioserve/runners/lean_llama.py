"""A lean forward for Llama-architecture checkpoints: transformers' arithmetic, fewer ops.

transformers' ``LlamaForCausalLM`` is written for every use (training, caches,
tensor parallelism); traced for one serving step it records about 560 aten ops
for a 5-layer model, a third of them shape arithmetic on 0-d tensors. On the CPU a
small model's step costs what its ops cost to launch, so this module runs the same
computation in fewer ops: the rotary embedding applied to queries and keys together,
views without shape arithmetic, and the decode attention of
:mod:`~aioserve.runners.decode_attention` over whole-block gathers. (The q/k/v
projections stay three matrix products: fused into one, MKL's single-row kernel
sums in another order and the logits are no longer bitwise transformers'.)

Every element is computed by the same operations in the same order as in
transformers (RMSNorm in float32, ``q * cos + rotate_half(q) * sin``, residual
adds, SiLU-gated MLP), so :class:`~aioserve.runners.traced.TracedDecode` accepts
it only where its logits equal the eager model's bit for bit, and keeps
transformers' own forward otherwise. Supported: ``model_type == "llama"`` without
projection biases, SiLU activation and a static rotary embedding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from aioserve.runners import decode_attention
from aioserve.runners.attention import attend_groups
from aioserve.runners.paged_metadata import AttentionGroup, PagedAttentionMetadata

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
        kv_caches: the runner's per-layer (K, V) caches.
        block_size: tokens per KV block.
        make_groups: turns the forward's group tensors into attention groups (the
            argument layout of :class:`~aioserve.runners.traced.TracedDecode`).
    """

    def __init__(
        self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        make_groups: Callable[[tuple[torch.Tensor, ...]], tuple[AttentionGroup, ...]],
    ) -> None:
        super().__init__()
        config = model.config
        inner = model.model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.make_groups = make_groups
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
        # made now, so that a trace holds it as a constant instead of rebuilding it
        decode_attention.head_selector(self.heads, self.kv_heads, self.embed.dtype,
                                       self.embed.device)

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
        slot_mapping: torch.Tensor, *group_tensors: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``[1, K, vocab]`` of the kept tokens (arguments: see TracedDecode)."""
        groups = self.make_groups(group_tensors)
        meta = PagedAttentionMetadata(self.kv_caches, slot_mapping, groups, self.block_size)
        x = F.embedding(input_ids[0], self.embed)  # [T, hidden]
        cos, sin = self._rope(position_ids[0], x.dtype)
        half = self.head_dim // 2
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
            k_cache, v_cache = self.kv_caches[index]
            k_cache.index_copy_(0, slot_mapping, k)
            v_cache.index_copy_(0, slot_mapping, v)
            attn = attend_groups(q, k_cache, v_cache, meta, self.scaling)
            x = x + F.linear(attn.flatten(1), o_w)
            h = self._rms_norm(x, norm2)
            x = x + F.linear(F.silu(F.linear(h, gate_w)) * F.linear(h, up_w), down_w)
        kept = self._rms_norm(x, self.final_norm).index_select(0, keep)
        return F.linear(kept, self.lm_head).unsqueeze(0)
