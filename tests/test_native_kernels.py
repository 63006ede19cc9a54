"""Decode attention in the compiled CPU kernels (native_kernels.py, csrc/).

Each test needs the kernels built (a C++ compiler and ninja); without them the tests
of the fallback still run and the others are skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from aioserve.runners.attention.paged import attend_layer
from aioserve.runners.attention.paged_metadata import build_metadata
from aioserve.runners.cpu import build_lock, native_kernels
from tests.test_sparse_decode import both_layouts, sdpa_per_sequence

CPU = torch.device("cpu")


@pytest.fixture
def native():
    if not native_kernels.available():
        pytest.skip("the native CPU kernels did not build here")


def decoders(starts: list[int], block_size: int, num_blocks: int, seed: int = 1):
    """Random block tables (distinct blocks, shuffled) for decoders at ``starts``."""
    rng = np.random.default_rng(seed)
    free = list(rng.permutation(np.arange(1, num_blocks)))
    tables = []
    for start in starts:
        need = start // block_size + 1
        tables.append([int(b) for b in free[:need]])
        free = free[need:]
    return tables


@pytest.mark.parametrize(("q_heads", "kv_heads", "dim"),
                         [(9, 3, 64), (8, 4, 8), (4, 4, 12), (6, 1, 40), (2, 2, 3)])
@pytest.mark.parametrize("head_major", [False, True])
def test_decode_matches_sdpa(native, q_heads, kv_heads, dim, head_major):
    block = 16
    caches = both_layouts(kv_heads, dim, 64 * block, seed=dim)[int(head_major)]
    starts = [0, 15, 16, 3, 100, 47, 31, 250]  # block edges, one token, several blocks
    tables = decoders(starts, block, 64)
    meta, _ = build_metadata([caches], starts, [1] * len(starts), tables, block, CPU,
                             native_decode=True)
    (group,) = meta.groups
    assert group.seq_lens is not None
    q = torch.randn(len(starts), q_heads, dim, generator=torch.Generator().manual_seed(3))
    calls = []
    kernel = native_kernels.decode_attention

    def spy(*args):
        calls.append(1)
        return kernel(*args)

    native_kernels.decode_attention = spy  # attend_layer takes the kernels
    try:
        got = attend_layer(None, None, q, *caches, meta)
    finally:
        native_kernels.decode_attention = kernel
    assert calls
    want = sdpa_per_sequence(q, *caches, np.array(starts), tables, block)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_sequence_gets_the_same_bits_with_any_batch_mates(native):
    block = 16
    k_cache, v_cache = both_layouts(3, 64, 80 * block)[1]
    starts = [70, 5, 200, 33, 129, 0, 16, 90, 250, 11]
    tables = decoders(starts, block, 80)
    q = torch.randn(len(starts), 9, 64, generator=torch.Generator().manual_seed(5))

    def run(rows: list[int]) -> torch.Tensor:
        picked = [tables[r] for r in rows]
        width = max(map(len, picked)) + 3  # a wider table than any row needs: masked
        padded = torch.tensor([t + [t[0]] * (width - len(t)) for t in picked])
        lens = torch.tensor([starts[r] + 1 for r in rows])
        return native_kernels.decode_attention(q[rows], k_cache, v_cache, padded, lens,
                                                 block, None)

    together = run(list(range(len(starts))))
    for row in range(len(starts)):
        assert torch.equal(run([row]), together[row : row + 1])
    assert torch.equal(run([2, 0]), together[[2, 0]])


@pytest.mark.parametrize("head_major", [False, True])
def test_bfloat16_caches_give_the_float32_kernels_bits_on_their_widened_values(native,
                                                                              head_major):
    block = 16
    k32, v32 = both_layouts(3, 64, 40 * block)[int(head_major)]
    k16, v16 = k32.to(torch.bfloat16), v32.to(torch.bfloat16)
    starts = [70, 5, 200, 0, 16, 129]
    tables = torch.tensor([t + [t[0]] * (13 - len(t)) for t in decoders(starts, block, 40)])
    lens = torch.tensor([s + 1 for s in starts])
    q = torch.randn(len(starts), 9, 64, generator=torch.Generator().manual_seed(7))
    got = native_kernels.decode_attention(q.bfloat16(), k16, v16, tables, lens, block, None)
    want = native_kernels.decode_attention(q.bfloat16().float(), k16.float(), v16.float(),
                                           tables, lens, block, None)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want.bfloat16())
    assert torch.equal(native_kernels.decode_attention(q[[3, 1]].bfloat16(), k16, v16,
                                                       tables[[3, 1]], lens[[3, 1]], block,
                                                       None), got[[3, 1]])


def test_bad_shapes_raise_and_name_the_argument(native):
    k_cache, v_cache = both_layouts(3, 64, 4 * 16)[0]
    tables = torch.zeros((2, 1), dtype=torch.int64)
    with pytest.raises(RuntimeError, match="seq_lens"):
        native_kernels.decode_attention(torch.randn(2, 9, 64), k_cache, v_cache, tables,
                                          torch.ones(3, dtype=torch.int64), 16, None)
    with pytest.raises(RuntimeError, match="block_tables"):
        native_kernels.decode_attention(torch.randn(2, 9, 64), k_cache, v_cache,
                                          tables + 4, torch.ones(2, dtype=torch.int64), 16,
                                          None)
    with pytest.raises(RuntimeError, match="seq_lens"):
        native_kernels.decode_attention(torch.randn(2, 9, 64), k_cache, v_cache, tables,
                                          torch.full((2,), 17, dtype=torch.int64), 16, None)
    with pytest.raises(RuntimeError, match="block_tables"):
        native_kernels.decode_attention(torch.randn(2, 9, 64), k_cache, v_cache,
                                          tables.int(), torch.ones(2, dtype=torch.int64), 16,
                                          None)


def test_greedy_tokens_equal_argmax(native):
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(33, 1003, generator=gen)
    logits[3, 500] = logits[3, 7] = 50.0  # a tie: the first index
    logits[4, 9] = float("nan")  # NaN counts as largest, as in argmax
    logits[5] = float("-inf")
    logits[6, -1] = float("inf")
    logits[7] = 0.0
    logits[7, 11] = -0.0
    logits[8, 2] = logits[8, 600] = float("nan")
    assert torch.equal(native_kernels.greedy_tokens(logits), logits.argmax(-1))
    assert torch.equal(native_kernels.greedy_tokens(logits[:, :7]), logits[:, :7].argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_rope_and_cache_equals_torch_bit_for_bit(native, tokens, dtype):
    gen = torch.Generator().manual_seed(tokens)
    heads, kv_heads, dim = 9, 3, 64
    fused = (torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen) * 30).to(dtype)
    qk = fused[:, : (heads + kv_heads) * dim].unflatten(1, (-1, dim))  # a strided view
    v = fused[:, (heads + kv_heads) * dim :].unflatten(1, (-1, dim))
    angles = torch.rand(tokens, 1, dim, generator=gen) * 100
    cos, signed_sin = angles.cos().to(dtype), angles.sin().to(dtype)
    signed_sin[..., : dim // 2] *= -1
    caches = [tuple(c.to(dtype) for c in both_layouts(kv_heads, dim, 64, seed=3)[1])
              for _ in range(2)]
    slots = torch.randperm(64, generator=gen)[:tokens]
    q = native_kernels.rope_and_cache(qk, v, cos, signed_sin, slots, *caches[0], heads)
    half = dim // 2
    swapped = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)
    rotated = (qk * cos) + (swapped * signed_sin)
    caches[1][0].index_copy_(0, slots, rotated[:, heads:])
    caches[1][1].index_copy_(0, slots, v)
    assert torch.equal(q, rotated[:, :heads]) and q.is_contiguous()
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    with pytest.raises(RuntimeError, match="slot_mapping"):
        native_kernels.rope_and_cache(qk, v, cos, signed_sin, slots + 64, *caches[0], heads)


@pytest.mark.parametrize("hidden", [576, 1024, 64, 100])
@pytest.mark.parametrize("tokens", [1, 7, 40])
def test_add_rms_norm_equals_torch_bit_for_bit(native, tokens, hidden):
    if not native_kernels.add_rms_norm_exact(hidden):
        pytest.skip("this torch sums rows in another order: the fused norm stays off")
    gen = torch.Generator().manual_seed(tokens)
    scales = torch.logspace(-3, 3, tokens)[:, None]  # tiny to large rows
    x = (torch.randn(tokens, hidden, generator=gen) * scales).bfloat16()
    delta = (torch.randn(tokens, hidden, generator=gen) * 3).bfloat16()
    weight = (torch.randn(hidden, generator=gen) * 2).bfloat16()
    for add in (None, delta):
        s = x if add is None else x + add
        s32 = s.to(torch.float32)
        want = weight * (s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(
            torch.bfloat16)
        got_x, got_h = native_kernels.add_rms_norm(x, add, weight, 1e-5)
        assert torch.equal(got_x, s) and torch.equal(got_h, want)
    with pytest.raises(RuntimeError, match="weight"):
        native_kernels.add_rms_norm(x, None, weight.float(), 1e-5)


@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_silu_and_mul_equals_torch_bit_for_bit(native, tokens):
    gen = torch.Generator().manual_seed(tokens)
    gate_up = (torch.randn(tokens, 2 * 200, generator=gen) * 8).bfloat16()  # a ragged tail
    gate_up[0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    gate, up = gate_up[:, :200], gate_up[:, 200:]
    want = torch.nn.functional.silu(gate.contiguous()) * up
    got = native_kernels.silu_and_mul(gate_up)
    nan = want.isnan()  # NaN's bits are not promised, only NaN
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    pairs = torch.stack((every, torch.ones_like(every)), dim=1)  # each bfloat16 once, x 1
    silu, want_all = native_kernels.silu_and_mul(pairs)[:, 0], torch.nn.functional.silu(every)
    nan = want_all.isnan()
    assert torch.equal(silu.isnan(), nan)
    assert torch.equal(silu.view(torch.int16)[~nan], want_all.view(torch.int16)[~nan])
    with pytest.raises(RuntimeError, match="gate_up"):
        native_kernels.silu_and_mul(gate_up.float())


def test_a_failed_build_falls_back_to_stock_kernels(tmp_path, caplog):
    from aioserve.runners.cpu.native_build import BuildFolder, build

    assert build(BuildFolder(sources=[tmp_path / "missing.cpp"], root=tmp_path)) is False
    assert "stock kernels" in caplog.text


def test_a_killed_builds_lock_is_removed_and_a_missing_one_is_not_waited_for(tmp_path, caplog):
    lock = tmp_path / "lock"
    build_lock.wait_for_build_lock(lock)  # no lock: returns at once
    lock.touch()
    old = time.time() - build_lock.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    build_lock.wait_for_build_lock(lock)
    assert not lock.exists() and "stale build lock" in caplog.text


def test_the_switch_turns_the_kernels_off():
    code = ("from aioserve.runners.cpu import native_kernels as n; "
            "print(n.available())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "AIOSERVE_NATIVE_KERNELS": "0"},
                         check=True, timeout=120)
    assert out.stdout.strip() == "False"
