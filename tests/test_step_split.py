"""A CPU step cut into parts that run side by side, the lean Llama forward, and the
decode metadata fast path: same tokens as transformers generate() run alone."""

from __future__ import annotations

import asyncio
import random
import threading

import numpy as np
import pytest
import torch
from test_perf_exactness import mixed_workload, run_staggered

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.runners import step_split
from aioserve.runners.decode_metadata import decode_metadata
from aioserve.runners.paged_metadata import build_metadata, visible_prefix


def test_split_rows_balances_work_and_keeps_batch_order():
    counts = [1] * 12 + [20]
    starts = [100 + 10 * i for i in range(12)] + [0]
    parts = step_split.split_rows(counts, starts, 2, min_cost=1)
    assert parts is not None and len(parts) == 2
    assert sorted(parts[0] + parts[1]) == list(range(13))
    assert all(part == sorted(part) for part in parts)
    loads = [sum(step_split.row_cost(counts[r], starts[r] + counts[r]) for r in p) for p in parts]
    assert max(loads) < 1.5 * min(loads)
    assert 12 in min(parts, key=len)  # the prompt chunk outweighs many decode rows


def test_split_rows_leaves_small_steps_whole():
    assert step_split.split_rows([1, 1], [5, 9], 2) is None  # below MIN_SPLIT_COST
    assert step_split.split_rows([400], [0], 2, min_cost=1) is None  # one row
    assert step_split.split_rows([1] * 8, [300] * 8, 1, min_cost=1) is None  # one part wanted
    assert len(step_split.split_rows([1] * 8, [300] * 8, 4, min_cost=1)) == 4


def test_merge_logits_restores_batch_order_of_sampled_rows():
    parts = [[0, 2, 3], [1, 4]]
    sample = [True, True, False, True, True]
    first = torch.tensor([[0.0], [3.0]])  # rows 0 and 3 (row 2 is not sampled)
    second = torch.tensor([[1.0], [4.0]])
    merged = step_split.merge_logits(parts, [first, second], sample)
    assert merged[:, 0].tolist() == [0.0, 1.0, 3.0, 4.0]
    unsampled_part = step_split.merge_logits([[0], [1]], [torch.ones(1, 1), torch.zeros(1, 1)],
                                             [False, True])
    assert unsampled_part[:, 0].tolist() == [0.0]


def test_visible_prefix_masks_past_each_length():
    mask = visible_prefix(np.array([0, 2, 5]), 4)
    assert mask.shape == (3, 4) and mask.dtype == np.float32
    assert (mask == 0).sum(axis=1).tolist() == [0, 2, 4]
    assert np.isneginf(mask[1, 2:]).all()


def test_decode_metadata_equals_general_builder():
    caches = [(torch.zeros(4096 * 16, 2, 8), torch.zeros(4096 * 16, 2, 8))]
    rng = random.Random(0)
    for _ in range(60):
        n, size = rng.randint(1, 40), rng.choice([8, 16, 32])
        starts = [rng.randint(0, 400) for _ in range(n)]
        tables = [[rng.randint(0, 4000) for _ in range(s // size + 1 + rng.randint(0, 2))]
                  for s in starts]
        cost = rng.choice([0, 2048, 1 << 62])
        meta, positions = build_metadata(caches, starts, [1] * n, tables, size,
                                         torch.device("cpu"), split_cost=cost, always_mask=True)
        fast_positions, slots, groups = decode_metadata(starts, tables, size, torch.float32, cost)
        assert torch.equal(positions, fast_positions)
        assert torch.equal(meta.slot_mapping, slots)
        assert len(groups) == len(meta.groups)
        for want, got in zip(meta.groups, groups):
            assert (want.token_index is None) == (got.token_index is None)
            if want.token_index is not None:
                assert torch.equal(want.token_index, got.token_index)
            assert torch.equal(want.gather_blocks, got.gather_blocks)
            assert want.mask.shape == got.mask.shape and torch.equal(want.mask, got.mask)


@pytest.mark.parametrize("lean", ["1", "0"])
async def test_split_steps_equal_solo_generate(model_dir, solo_greedy, monkeypatch, lean):
    monkeypatch.setenv("AIOSERVE_STEP_PARTS", "2")
    monkeypatch.setenv("AIOSERVE_LEAN", lean)
    monkeypatch.setattr(step_split, "MIN_SPLIT_COST", 1)  # split every step of 2+ rows
    calls = []
    real_split = step_split.split_rows

    def counting_split(*args, **kwargs):
        parts = real_split(*args, **kwargs)
        calls.append(parts)
        return parts

    monkeypatch.setattr(step_split, "split_rows", counting_split)
    workload = mixed_workload(11)
    config = EngineConfig(model=model_dir, max_num_seqs=6, max_num_batched_tokens=96)
    async with AsyncEngine(config) as engine:
        runner = engine.runner
        assert runner.step_parts == 2
        assert all(runner.traced.lean.values()) == (lean == "1")
        results = await run_staggered(engine, workload, 11)
        assert engine.core.blocks.num_free_blocks == engine.core.blocks.num_blocks
    assert sum(parts is not None for parts in calls) > 10
    for (prompt, max_tokens), got in zip(workload, results):
        assert got == solo_greedy(prompt, max_tokens), f"prompt of {len(prompt)} tokens"


def test_lean_forward_is_used_for_the_test_model(model_dir):
    from aioserve.runners.torch_runner import TorchRunner

    runner = TorchRunner(EngineConfig(model=model_dir, max_num_seqs=4))
    try:
        assert runner.traced is not None
        assert runner.traced.lean == {1: True, 2: True, 3: True, 4: True}
    finally:
        runner.close()


def test_cpu_layout_shares_the_thread_budget(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("AIOSERVE_NUM_THREADS", raising=False)
    monkeypatch.delenv("AIOSERVE_STEP_PARTS", raising=False)
    monkeypatch.setattr(step_split.os, "cpu_count", lambda: 2)
    assert step_split.cpu_layout(cpu, can_split=True) == (2, 1)
    assert step_split.cpu_layout(cpu, can_split=False) == (1, 1)  # a core left to the loop
    monkeypatch.setattr(step_split.os, "cpu_count", lambda: 16)
    assert step_split.cpu_layout(cpu, can_split=True) == (2, 7)
    monkeypatch.setenv("AIOSERVE_NUM_THREADS", "1")
    assert step_split.cpu_layout(cpu, can_split=True) == (1, 1)
    monkeypatch.setenv("AIOSERVE_STEP_PARTS", "3")
    assert step_split.cpu_layout(cpu, can_split=True) == (3, 1)
    assert step_split.cpu_layout(torch.device("meta"), can_split=True) == (1, None)


async def test_a_failing_part_fails_its_step_and_the_engine_keeps_serving(
    model_dir, solo_greedy, monkeypatch
):
    from aioserve.errors import EngineError

    monkeypatch.setenv("AIOSERVE_STEP_PARTS", "2")
    monkeypatch.setattr(step_split, "MIN_SPLIT_COST", 1)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    prompts = [[1, 20 + i, 30 + i] for i in range(4)]
    async with AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=4)) as engine:
        runner = engine.runner
        real = runner._forward_part
        failures = []

        def flaky(part):
            if not failures and threading.current_thread().name.startswith("aioserve-runner-part"):
                failures.append(part.rows)
                raise RuntimeError("injected part failure")
            return real(part)

        monkeypatch.setattr(runner, "_forward_part", flaky)

        async def one(prompt):
            return [t async for out in engine.generate(prompt, params) for t in out.token_ids]

        first = await asyncio.gather(*(one(p) for p in prompts), return_exceptions=True)
        assert failures and all(isinstance(r, EngineError) for r in first)
        assert engine.core.blocks.num_free_blocks == engine.core.blocks.num_blocks
        again = await asyncio.gather(*(one(p) for p in prompts))
    assert again == [solo_greedy(p, 5) for p in prompts]


def test_bad_thread_settings_name_the_variable(monkeypatch):
    monkeypatch.setenv("AIOSERVE_STEP_PARTS", "two")
    with pytest.raises(ValueError, match="AIOSERVE_STEP_PARTS must be a positive integer"):
        step_split.cpu_layout(torch.device("cpu"), can_split=True)
    monkeypatch.setenv("AIOSERVE_STEP_PARTS", "2")
    monkeypatch.setenv("AIOSERVE_NUM_THREADS", "0")
    with pytest.raises(ValueError, match="AIOSERVE_NUM_THREADS"):
        step_split.cpu_layout(torch.device("cpu"), can_split=False)
