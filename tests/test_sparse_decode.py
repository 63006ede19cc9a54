"""Decode attention that reads a head-major CPU cache in place (sparse kernels).

It serves heads of at least ``MIN_HEAD_DIM`` elements; the test model's are 8 wide, so
the end-to-end check runs an exactly equivalent copy of it with heads zero-padded to
32 wide (:func:`pad_heads`). Where the compiled kernels
(:mod:`~aioserve.runners.cpu.native_kernels`) are loaded they take decode groups first, so
these tests switch them off: the sparse kernels serve when the build fails.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.runners.attention import sparse_decode
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.paged import attend_layer
from aioserve.runners.attention.paged_metadata import build_metadata
from aioserve.runners.cpu import native_kernels
from aioserve.runners.model import loader as model_loader

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def stock_kernels(monkeypatch):
    """Decode groups take the stock-kernel paths, as where the native build fails."""
    monkeypatch.setattr(native_kernels, "available", lambda: False)


def both_layouts(kv_heads: int, dim: int, rows: int, seed: int = 0):
    """(token-major, head-major) caches holding the same random K and V."""
    layer = LayerRules(kv_heads * 3, kv_heads, dim, dim, None, None, None, False)
    gen = torch.Generator().manual_seed(seed)
    filled = [torch.randn(rows, kv_heads, dim, generator=gen) for _ in range(2)]
    out = []
    for head_major in (False, True):
        k, v = model_loader.allocate_kv_cache({0: layer}, rows, torch.float32, CPU, head_major)[0]
        k.copy_(filled[0])
        v.copy_(filled[1])
        out.append((k, v))
    return out


def sdpa_per_sequence(q, k_cache, v_cache, starts, tables, block_size):
    """Each sequence's attention over its own slots, by SDPA (independent reference)."""
    out = []
    for row, (start, table) in enumerate(zip(starts, tables)):
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size
                              for p in range(int(start) + 1)])
        keys = k_cache[slots].transpose(0, 1)[None]  # [1, kv_heads, L, dim]
        values = v_cache[slots].transpose(0, 1)[None]
        out.append(torch.nn.functional.scaled_dot_product_attention(
            q[row][None, :, None], keys, values, enable_gqa=True)[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize(("q_heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 32), (6, 1, 32)])
def test_in_place_decode_matches_sdpa(q_heads, kv_heads, dim):
    _, head_major = both_layouts(kv_heads, dim, 40 * 4)
    starts = np.array([30, 2, 0, 61, 17, 45])  # six decoders: cut into groups by length
    counts = np.ones(6, dtype=np.int64)
    rng = np.random.default_rng(1)
    tables = [list(rng.permutation(np.arange(1, 40))[: (s + 1 + 3) // 4]) for s in starts]
    meta, _ = build_metadata([head_major], starts, counts, tables, 4, CPU)
    q = torch.randn(6, q_heads, dim, generator=torch.Generator().manual_seed(2))
    got = attend_layer(None, None, q, *head_major, meta)
    assert all(group.sparse_indices for group in meta.groups)  # took the sparse kernels
    want = sdpa_per_sequence(q, *head_major, starts, tables, 4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_sequence_gets_the_same_bits_with_any_batch_mates():
    _, (k_cache, v_cache) = both_layouts(3, 64, 60 * 4)
    q = torch.randn(5, 9, 64, generator=torch.Generator().manual_seed(3))
    tables = [[7, 2, 5, 9], [11, 12], [20, 21, 22, 23, 24, 25, 26, 27], [30], [40, 41, 42]]
    starts = np.array([13, 5, 29, 0, 9])
    ones = np.ones(5, dtype=np.int64)
    meta, _ = build_metadata([(k_cache, v_cache)], starts, ones, tables, 4, CPU)
    together = attend_layer(None, None, q, k_cache, v_cache, meta)
    for row in range(5):
        alone_meta, _ = build_metadata([(k_cache, v_cache)], starts[row : row + 1], ones[:1],
                                       [tables[row]], 4, CPU)
        alone = attend_layer(None, None, q[row : row + 1], k_cache, v_cache, alone_meta)
        assert torch.equal(alone[0], together[row])


def test_narrow_heads_keep_the_block_gather():
    _, head_major = both_layouts(2, 16, 8 * 4)
    meta, _ = build_metadata([head_major], np.array([5, 9]), np.ones(2, dtype=np.int64),
                             [[1, 2], [3, 4, 5]], 4, CPU)
    attend_layer(None, None, torch.randn(2, 6, 16), *head_major, meta)
    assert sparse_decode.MIN_HEAD_DIM > 16 and not meta.groups[0].sparse_indices


def pad_heads(source: str, target: Path, width: int = 32) -> str:
    """The Llama checkpoint ``source`` with heads zero-padded from ``dim`` to ``width``
    wide, exactly equivalent: original dims i and i + dim/2 (a RoPE pair) go to padded
    dims r*i and width/2 + r*i (r = width / dim), the pair of the same rotary frequency;
    q is scaled by sqrt(r) (exact for r = 4) so the 1/sqrt(width) score scale equals
    1/sqrt(dim). Every score, and so every output, is the original model's."""
    from safetensors.torch import load_file, save_file

    config = json.loads(Path(source, "config.json").read_text())
    heads, kv_heads, hidden = (config["num_attention_heads"], config["num_key_value_heads"],
                               config["hidden_size"])
    dim = config.get("head_dim") or hidden // heads
    ratio, half = width // dim, dim // 2
    place = torch.tensor([ratio * i if i < half else width // 2 + ratio * (i - half)
                          for i in range(dim)])

    def pad_rows(weight: torch.Tensor, count: int, scale: float = 1.0) -> torch.Tensor:
        padded = torch.zeros(count, width, hidden)
        padded[:, place] = weight.view(count, dim, hidden) * scale
        return padded.reshape(count * width, hidden)

    weights = load_file(str(Path(source, "model.safetensors")))
    for name, weight in weights.items():
        if name.endswith("q_proj.weight"):
            weights[name] = pad_rows(weight, heads, ratio**0.5)
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            weights[name] = pad_rows(weight, kv_heads)
        elif name.endswith("o_proj.weight"):
            padded = torch.zeros(hidden, heads, width)
            padded[:, :, place] = weight.view(hidden, heads, dim)
            weights[name] = padded.reshape(hidden, heads * width)
    target.mkdir()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(target / "model.safetensors"))
    config.update(head_dim=width)
    (target / "config.json").write_text(json.dumps(config))
    return str(target)


async def test_engine_on_wide_heads_equals_solo_generate(model_dir, solo_greedy, tmp_path,
                                                         monkeypatch):
    wide = pad_heads(model_dir, tmp_path / "wide")
    calls = []
    in_place = sparse_decode.sparse_decode_attention
    monkeypatch.setattr(sparse_decode, "sparse_decode_attention",
                        lambda *args: calls.append(1) or in_place(*args))
    rng = np.random.default_rng(4)
    workload = [([1, *rng.integers(3, 511, n - 1).tolist()], int(rng.integers(8, 40)))
                for n in (3, 40, 90, 7, 150, 25, 60, 12)]
    params = {n: SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for _, n in workload}
    config = EngineConfig(model=wide, tokenizer=model_dir, max_num_seqs=8, num_kv_blocks=128)
    async with AsyncEngine(config) as engine:
        runner = engine.runner
        assert runner is not None and runner.kv_caches[0][0].shape[-1] == 32

        async def one(prompt: list[int], max_tokens: int) -> list[int]:
            stream = engine.generate(prompt, params[max_tokens])
            return [t async for out in stream for t in out.token_ids]

        results = await asyncio.gather(*(one(p, n) for p, n in workload))
    assert len(calls) > 100  # the decode steps read the cache in place
    for (prompt, n), got in zip(workload, results):
        assert got == solo_greedy(prompt, n)
