"""The CPU fast paths keep greedy outputs equal to transformers generate() run alone.

Covers what the fast paths change: decode and prefill attending in separate groups,
decode groups split by context length, whole-block gathers, chunked prefill, the
step pipeline (next step started before the fan-out) and the worker's thread count.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import torch

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.runners.attention import paged_metadata
from aioserve.runners.attention.paged_metadata import build_metadata, split_by_length
from aioserve.runners.cpu import native_kernels


def mixed_workload(seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 90, 150] + [rng.randint(1, 120) for _ in range(8)]
    return [([1] + [rng.randint(3, 511) for _ in range(n - 1)], rng.randint(5, 30))
            for n in lengths]


async def run_staggered(engine: AsyncEngine, workload, seed: int) -> list[list[int]]:
    rng = random.Random(seed)

    async def one(prompt: list[int], max_tokens: int) -> list[int]:
        await asyncio.sleep(rng.random() * 0.05)
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        return [t async for out in engine.generate(prompt, params) for t in out.token_ids]

    return await asyncio.gather(*(one(p, n) for p, n in workload))


@pytest.mark.parametrize(("block_size", "budget", "split_cost", "stock_kernels"),
                         [(16, 4096, 0, True), (8, 48, 0, False),
                          (32, 4096, paged_metadata.SPLIT_COST, False)])
async def test_fast_paths_equal_solo_generate(model_dir, solo_greedy, monkeypatch,
                                              block_size, budget, split_cost, stock_kernels):
    monkeypatch.setattr(paged_metadata, "SPLIT_COST", split_cost)  # 0: always split groups
    if stock_kernels:  # decode groups split by length and attend through stock kernels
        monkeypatch.setattr(native_kernels, "available", lambda: False)
    workload = mixed_workload(block_size)
    config = EngineConfig(model=model_dir, max_num_seqs=6, block_size=block_size,
                          max_num_batched_tokens=budget)
    async with AsyncEngine(config) as engine:
        results = await run_staggered(engine, workload, block_size)
        assert engine.core.blocks.num_free_blocks == engine.core.blocks.num_blocks
    for (prompt, max_tokens), got in zip(workload, results):
        assert got == solo_greedy(prompt, max_tokens), f"prompt of {len(prompt)} tokens"


def test_split_by_length_cuts_only_when_it_saves_work():
    lens = np.array([10, 12, 11, 300, 310, 9, 305, 8])
    rows = np.arange(lens.size)
    groups = split_by_length(rows, lens, call_cost=100)
    assert len(groups) == 2
    assert sorted(np.concatenate(groups).tolist()) == rows.tolist()
    assert set(groups[1].tolist()) == {3, 4, 6}
    assert len(split_by_length(rows, lens, call_cost=10**6)) == 1
    assert len(split_by_length(rows[:3], lens, call_cost=0)) == 1


def test_split_by_length_cuts_again_up_to_max_groups():
    lens = np.array([10, 12, 150, 300, 310, 9, 160, 140, 8, 305])
    rows = np.arange(lens.size)
    groups = split_by_length(rows, lens, call_cost=100, max_groups=4)
    assert sorted(np.concatenate(groups).tolist()) == rows.tolist()
    assert [set(g.tolist()) for g in groups] == [{0, 1, 5, 8}, {2, 6, 7}, {3, 4, 9}]
    assert len(split_by_length(rows, lens, call_cost=100, max_groups=2)) == 2


def test_metadata_groups_cover_every_token_once(monkeypatch):
    monkeypatch.setattr(paged_metadata, "SPLIT_COST", 0)
    caches = [(torch.zeros(64 * 4, 2, 8), torch.zeros(64 * 4, 2, 8))]
    starts, counts = [0, 40, 3, 100, 7, 90], [5, 1, 1, 1, 3, 1]
    tables = [[0, 1], [2, 3, 4], [5], [6, 7, 8, 9, 10, 11, 12], [13], [14, 15, 16, 17, 18, 19]]
    meta, positions = build_metadata(caches, starts, counts, tables, 16, torch.device("cpu"))
    assert positions.tolist() == [0, 1, 2, 3, 4, 40, 3, 100, 7, 8, 9, 90]
    assert meta.slot_mapping.tolist()[:5] == [0, 1, 2, 3, 4]
    assert meta.slot_mapping.tolist()[5] == 4 * 16 + 8  # position 40: third block (id 4)
    covered = sorted(t for g in meta.groups for t in g.token_index.tolist())
    assert covered == list(range(12))
    assert len(meta.groups) == 3  # decode split in two (contexts 4, 41 | 91, 101) + prefill
    for group in meta.groups:
        assert group.mask is None or group.mask.shape[-1] == group.gather_blocks.shape[1] * 16


def test_prefill_rows_split_by_work(monkeypatch):
    monkeypatch.setattr(paged_metadata, "SPLIT_COST", 0)
    caches = [(torch.zeros(64 * 16, 2, 8), torch.zeros(64 * 16, 2, 8))]
    counts = [3, 100, 4, 120, 2]
    tables = [[i * 8 + j for j in range(8)] for i in range(5)]
    meta, _ = build_metadata(caches, [0] * 5, counts, tables, 16, torch.device("cpu"))
    assert len(meta.groups) == 2
    short, long = sorted(meta.groups, key=lambda g: g.gather_blocks.shape[1])
    # contexts of 2-4 tokens: one block, widened to MIN_CONTEXT_WIDTH (32 tokens, 2 blocks)
    assert short.gather_blocks.shape == (3, 2) and long.gather_blocks.shape == (2, 8)
    covered = sorted(t for g in meta.groups for t in g.token_index.tolist())
    assert covered == list(range(sum(counts)))


async def test_prefill_split_equals_solo_generate(model_dir, solo_greedy, monkeypatch):
    monkeypatch.setattr(paged_metadata, "SPLIT_COST", 0)
    rng = random.Random(5)
    workload = [([1] + [rng.randint(3, 511) for _ in range(n - 1)], 6) for n in (3, 90, 5, 120, 2)]
    config = EngineConfig(model=model_dir, max_num_seqs=8)
    async with AsyncEngine(config) as engine:
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

        async def one(prompt):
            return [t async for out in engine.generate(prompt, params) for t in out.token_ids]

        results = await asyncio.gather(*(one(p) for p, _ in workload))
    for (prompt, n), got in zip(workload, results):
        assert got == solo_greedy(prompt, n)


def test_head_major_decode_matches_sdpa():
    from aioserve.runners.attention.decode_gather import decode_attention, decode_bias

    torch.manual_seed(0)
    q = torch.randn(5, 8, 16)
    keys, values = torch.randn(4, 5, 40, 16), torch.randn(4, 5, 40, 16)
    lens = torch.tensor([40, 3, 17, 1, 39])
    allowed = torch.arange(40)[None, :] < lens[:, None]
    mask = torch.zeros(5, 1, 1, 40).masked_fill(~allowed[:, None, None, :], float("-inf"))
    got = decode_attention(q, keys, values, decode_bias(mask, 4), None)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), keys.transpose(0, 1), values.transpose(0, 1), attn_mask=mask,
        enable_gqa=True,
    ).squeeze(2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # every query head reads its own KV head: changing KV head 3 moves only heads 6, 7
    keys[3] += 1.0
    moved = (decode_attention(q, keys, values, decode_bias(mask, 4), None) - got).abs()
    moved = moved.amax(dim=(0, 2))
    assert moved[:6].eq(0).all() and moved[6:].gt(0).all()
