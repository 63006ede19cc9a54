"""Tiny random decoders of many transformers architectures, with rules small enough to matter."""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

#: Sliding window of the windowed architectures, in tokens.
WINDOW = 16

_COMMON: dict[str, Any] = {
    "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 512,
    "head_dim": 16, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 0,
}
_MOE = {"num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "num_experts": 4, "shared_expert_intermediate_size": 32}

#: Per architecture (transformers ``model_type``), its settings beyond the common ones.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {}, "mistral": {"sliding_window": WINDOW}, "mixtral": dict(_MOE),
    "qwen2": {}, "qwen2_moe": {**_MOE, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "qwen3": {}, "qwen3_moe": {**_MOE, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "gemma": {},
    "gemma2": {"sliding_window": WINDOW, "attn_logit_softcapping": 2.0,
               "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 16},
    "gemma3_text": {"sliding_window": WINDOW, "query_pre_attn_scalar": 16,
                    "layer_types": ["sliding_attention", "full_attention"]},
    "phi": {"partial_rotary_factor": 0.5}, "phi3": {}, "gpt2": {}, "gpt_neox": {},
    "gptj": {"rotary_dim": 8}, "opt": {"ffn_dim": 128, "word_embed_proj_dim": 64},
    "falcon": {"new_decoder_architecture": True, "num_kv_heads": 2, "head_dim": None},
    "stablelm": {},
    "starcoder2": {"sliding_window": WINDOW}, "olmo": {}, "olmo2": {}, "cohere": {},
    "granite": {},
    "deepseek_v3": {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 16, "v_head_dim": 8, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
                    "num_key_value_heads": 4, "head_dim": None,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    "gpt_oss": {**_MOE, "sliding_window": WINDOW,
                "layer_types": ["sliding_attention", "full_attention"]},
    "bloom": {}, "mpt": {}, "persimmon": {}, "codegen": {"rotary_dim": 8},
    "cohere2": {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
}


def tiny_config(model_type: str) -> PretrainedConfig:
    """The tiny float32 config of ``model_type``; KeyError when not in :data:`ARCHITECTURES`."""
    settings = {**_COMMON, **ARCHITECTURES[model_type]}
    settings = {key: value for key, value in settings.items() if value is not None}
    config = AutoConfig.for_model(model_type, **settings)
    if model_type == "mpt":  # mpt keeps its sizes under other names
        config.d_model, config.n_heads, config.n_layers = 64, 4, 2
        config.max_seq_len = 512
    return config


def _reinit(model: PreTrainedModel, seed: int) -> None:
    """Weights large enough that greedy output is not one repeated token."""
    generator = torch.Generator().manual_seed(seed)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if id(param) in embeddings:
                std = 1.0
            elif param.dim() >= 2:
                std = 2.0 / math.sqrt(param.shape[-1])
            elif name.endswith("sinks"):
                std = 1.0
            elif name.endswith("bias"):
                std = 0.1
            else:
                continue  # norm weights keep their init
            param.copy_(torch.randn(param.shape, generator=generator) * std)


def build(model_type: str, seed: int = 0) -> PreTrainedModel:
    config = tiny_config(model_type)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _reinit(model, seed)
    model.eval()
    return model


def greedy(model: PreTrainedModel, prompt: list[int], max_new_tokens: int) -> list[int]:
    """``generate()`` alone, greedy, no stop token: the continuation's ids."""
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]  # GenerationMixin.generate
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    ids: list[int] = out[0, len(prompt):].tolist()
    return ids
