"""Helpers of the flex-backend and CUDA-graph tests: random paged caches and block
tables, both backends' attention, a tiny random llama on disk, model steps."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from aioserve.runners.attention.flex.backend import FlexBackend
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.reference import ReferenceBackend
from aioserve.runners.model import loader as model_loader


def random_cache(num_blocks, block_size, kv_heads, dim, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks * block_size, kv_heads, dim)
    return (torch.randn(shape, generator=gen).to(device),
            torch.randn(shape, generator=gen).to(device))


def random_tables(lengths, block_size, num_blocks, seed=0, shared_prefix=0):
    """Distinct blocks per sequence (block 0 never used: the scratch block); the
    first ``shared_prefix`` blocks are the same for every sequence."""
    pool = list(range(1, num_blocks))
    random.Random(seed).shuffle(pool)
    prefix, pool = pool[:shared_prefix], pool[shared_prefix:]
    tables = []
    for length in lengths:
        need = -(-length // block_size) - len(prefix)
        tables.append(prefix + pool[:need])
        pool = pool[need:]
    return tables


def both_attend(cache, starts, counts, tables, block_size, rules, device="cpu", seed=1):
    """(reference, flex) outputs of one layer over ``cache`` for the step."""
    k_cache, v_cache = cache
    windows = (rules.window,) if rules.window else ()
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(counts), rules.q_heads, rules.k_dim, generator=gen).to(device)
    out = []
    for backend in (ReferenceBackend(), FlexBackend(torch.device(device))):
        meta, _ = backend.build_metadata([cache], starts, counts, tables, block_size,
                                         torch.device(device), windows)
        out.append(backend.attend(q, k_cache, v_cache, meta, rules, None))
    return out


def rules_of(q_heads=4, kv_heads=2, dim=8, window=None, softcap=None, scaling=None):
    return LayerRules(q_heads, kv_heads, dim, dim, scaling, window, softcap, False)


def tiny_llama(directory: Path, head_dim=32, vocab=256, seed=0) -> str:
    """A random 2-layer llama (8 query heads, 2 KV heads) saved to ``directory``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=8 * head_dim, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=head_dim, max_position_embeddings=512)
    LlamaForCausalLM(config).save_pretrained(directory)
    return str(directory)


def load(path, backend, device, num_blocks, block_size, dtype=torch.float32):
    model, rules = model_loader.load_model(path, dtype, torch.device(device), backend)
    caches = model_loader.allocate_kv_cache(rules, num_blocks * block_size, dtype,
                                            torch.device(device))
    return model, caches


@torch.inference_mode()
def model_step(model, backend, caches, token_ids, starts, tables, block_size, device="cpu"):
    """Logits ``[T, vocab]`` of one packed step (token_ids: per sequence, its new tokens)."""
    from aioserve.runners.attention import layer_rules

    meta, positions = backend.build_metadata(
        caches, starts, [len(t) for t in token_ids], tables, block_size, torch.device(device), ()
    )
    ids = torch.tensor([t for ts in token_ids for t in ts], device=device)[None]
    with layer_rules.metadata_context(meta):
        return model(input_ids=ids, position_ids=positions[None], use_cache=False,
                     paged_metadata=meta).logits[0]
