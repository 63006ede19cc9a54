"""The CPU's oneDNN-packed linear layers and head-major KV cache keep the numbers.

Packed linears must agree with ``torch.nn.Linear`` and give a row the same bits in any
batch (the premise of batch invariance); the head-major cache must attend exactly as
the token-major one does, for plain, windowed and soft-capped layers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from isa_support import LEVELS, onednn_level

from aioserve import EngineConfig
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.paged import attend_layer
from aioserve.runners.attention.paged_metadata import build_metadata
from aioserve.runners.cpu import packed_linear
from aioserve.runners.model import loader as model_loader

needs_onednn = pytest.mark.skipif(
    not packed_linear.available(torch.device("cpu"), torch.float32, 10**9),
    reason="this torch has no oneDNN",
)


@needs_onednn
@pytest.mark.skipif(LEVELS.index(onednn_level()) < LEVELS.index("avx2"),
                    reason="oneDNN runs below AVX2 here (ONEDNN_MAX_CPU_ISA): its rows "
                           "depend on the row count, which is promised from AVX2 up only")
def test_packed_linear_agrees_with_linear_and_rows_ignore_their_batch():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 172, bias=True)
    packed = packed_linear.PackedLinear(linear)
    x = torch.randn(3, 77, 64)
    with torch.inference_mode():
        full = packed(x)
        torch.testing.assert_close(full, linear(x), rtol=1e-5, atol=1e-5)
        rows = x.reshape(-1, 64)
        flat = full.reshape(-1, 172)
        for count in (1, 2, 31, 32, 33, 100):
            assert torch.equal(packed(rows[:count]), flat[:count])
        assert torch.equal(packed(rows[150:151]), flat[150:151])


@needs_onednn
def test_fused_packed_projection_equals_its_parts():
    torch.manual_seed(1)
    parts = [torch.randn(n, 64) for n in (64, 32, 32)]
    fused = packed_linear.pack_weight(torch.cat(parts))
    x = torch.randn(11, 64)
    want = torch.cat([packed_linear.linear_pointwise(x, packed_linear.pack_weight(w))
                      for w in parts], dim=1)
    assert torch.equal(packed_linear.linear_pointwise(x, fused), want)


@needs_onednn
@pytest.mark.parametrize("min_parameters", [0, packed_linear.MIN_PARAMETERS])
def test_cpu_float32_runner_packs_the_linears_of_a_large_model(model_dir, monkeypatch,
                                                               min_parameters):
    from aioserve.runners.torch.runner import TorchRunner

    monkeypatch.setattr(packed_linear, "MIN_PARAMETERS", min_parameters)
    runner = TorchRunner(EngineConfig(model=model_dir, num_kv_blocks=8, device="cpu",
                                      dtype="float32", forward="lean-llama"))
    try:
        kinds = {type(m) for m in runner.model.modules()}
        large = min_parameters == 0  # the test model has 292,800 parameters
        assert (packed_linear.PackedLinear in kinds) is large
        assert (torch.nn.Linear in kinds) is not large
        assert runner.lean is not None and runner.lean.packed is large  # bitwise checked
        if large:  # the lean forward holds q/k/v and gate/up fused; the layers' copies go
            attn = runner.model.model.layers[0].self_attn
            q_proj = attn.q_proj
            assert q_proj.packed is None and attn.o_proj.packed is not None
            with pytest.raises(RuntimeError, match="released"):
                q_proj(torch.zeros(1, 64))
        assert not runner.kv_caches[0][0].is_contiguous()  # head-major storage
    finally:
        runner.close()
    assert packed_linear.available(torch.device("cpu"), torch.bfloat16, 10**9) is \
        packed_linear.native_bf16()


RULES = {  # (layer rules, or None for a plain layer; KV heads; K width; V width)
    "plain": (None, 4, 16, 16),
    "one-kv-head": (None, 1, 16, 16),
    "window": (LayerRules(8, 4, 16, 16, None, 5, None, False), 4, 16, 16),
    "softcap": (LayerRules(8, 4, 16, 16, None, None, 30.0, False), 4, 16, 16),
    "mla-widths": (LayerRules(8, 4, 24, 16, None, None, None, False), 4, 24, 16),
}


@pytest.mark.parametrize("kind", sorted(RULES))
def test_head_major_cache_attends_as_token_major(kind):
    torch.manual_seed(2)
    rules, kv_heads, k_dim, v_dim = RULES[kind]
    layer = LayerRules(8, kv_heads, k_dim, v_dim, None, None, None, False)
    caches = {major: model_loader.allocate_kv_cache({0: layer}, 12 * 4, torch.float32,
                                                    torch.device("cpu"), major)[0]
              for major in (False, True)}
    filled = torch.randn(48, kv_heads, k_dim), torch.randn(48, kv_heads, v_dim)
    for k_cache, v_cache in caches.values():
        k_cache.copy_(filled[0])
        v_cache.copy_(filled[1])
    # two decoding sequences and one prefill chunk, over scattered blocks
    starts, counts = np.array([9, 3, 4]), np.array([1, 1, 6])
    tables = [[7, 2, 5], [0], [11, 4, 8]]
    windows = (5,) if kind == "window" else ()
    meta, _ = build_metadata([caches[False]], starts, counts, tables, 4,
                             torch.device("cpu"), windows=windows)
    q = torch.randn(int(counts.sum()), 8, k_dim)
    want = attend_layer(0.25, rules, q, *caches[False], meta)
    got = attend_layer(0.25, rules, q, *caches[True], meta)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
