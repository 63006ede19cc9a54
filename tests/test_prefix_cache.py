"""Prefix caching on the real model: a shared prefix is computed once, and no output
token changes (staggered arrivals, preemption, chunked prefill, duplicate prompts)."""

from __future__ import annotations

import asyncio
import random

import pytest

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.runners.base import ScheduledBatch


def shared_prefix_prompts(num: int, prefix_len: int, suffix_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [1] + [rng.randint(3, 511) for _ in range(prefix_len - 1)]
    return [prefix + [rng.randint(3, 511) for _ in range(suffix_len)] for _ in range(num)]


async def run_staggered(engine: AsyncEngine, prompts, params: SamplingParams) -> list[list[int]]:
    """Each request is added once the previous one has produced its first token, so
    later ones find the prefix cached while it is still running."""

    async def rest(stream, first) -> list[int]:
        return first.token_ids + [t async for out in stream for t in out.token_ids]

    tasks = []
    for prompt in prompts:
        stream = engine.generate(prompt, params)
        first = await anext(stream)
        tasks.append(asyncio.create_task(rest(stream, first)))
    return await asyncio.gather(*tasks)


async def run_together(engine: AsyncEngine, prompts, params: SamplingParams) -> list[list[int]]:
    async def one(prompt) -> list[int]:
        return [t async for out in engine.generate(prompt, params) for t in out.token_ids]

    return await asyncio.gather(*(one(p) for p in prompts))


SCENARIOS = {
    # name: (engine options, prompts (num, prefix, suffix), submit staggered?)
    "staggered": ({"block_size": 8}, (5, 40, 7), True),
    "preemption": ({"block_size": 4, "num_kv_blocks": 20, "max_num_seqs": 4}, (4, 24, 5), False),
    "chunked": ({"block_size": 4, "max_num_batched_tokens": 12}, (4, 30, 6), True),
    "duplicates": ({"block_size": 4}, (1, 33, 0), False),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_caching_changes_no_token(model_dir, solo_greedy, scenario):
    options, (num, prefix, suffix), staggered = SCENARIOS[scenario]
    prompts = shared_prefix_prompts(num, prefix, suffix, seed=len(scenario))
    if scenario == "duplicates":
        prompts = prompts * 4  # like n=4: the same prompt submitted together
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    results, stats = {}, {}
    for caching in (True, False):
        config = EngineConfig(model=model_dir, enable_prefix_caching=caching, **options)
        async with AsyncEngine(config) as engine:
            run = run_staggered if staggered else run_together
            results[caching] = await run(engine, prompts, params)
            stats[caching] = engine.stats()
            engine.core.blocks.check_integrity(held=[])
    expected = [solo_greedy(p, 10) for p in prompts]
    assert results[True] == results[False] == expected
    assert stats[False]["prefix_cache_hits"] == 0
    if scenario == "preemption":
        assert stats[True]["num_preemptions"] > 0  # precondition: recompute happened
    if scenario != "duplicates":  # duplicates admitted together find nothing cached yet
        assert stats[True]["prefix_cache_hits"] > 0


async def test_a_hit_computes_fewer_tokens(model_dir, solo_greedy):
    first, second = shared_prefix_prompts(2, 48, 5, seed=3)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    config = EngineConfig(model=model_dir, block_size=16)
    async with AsyncEngine(config) as engine:
        fed: list[int] = []
        schedule = engine.core.schedule

        def counting_schedule() -> ScheduledBatch | None:
            batch = schedule()
            fed.append(batch.num_tokens if batch is not None else 0)
            return batch

        engine.core.schedule = counting_schedule  # observes the real batches
        outputs = {}
        for name, prompt in (("first", first), ("second", second)):
            fed.clear()
            outs = [out async for out in engine.generate(prompt, params)]
            outputs[name] = (outs, sum(fed))
    (first_outs, first_fed), (second_outs, second_fed) = outputs["first"], outputs["second"]
    assert first_outs[-1].num_cached_tokens == 0
    assert second_outs[-1].num_cached_tokens == 48  # three full blocks of 16
    assert second_outs[-1].usage["prompt_tokens_details"] == {"cached_tokens": 48}
    # prompt + 3 decode tokens fed; the second skips its 48 cached prompt tokens
    assert first_fed == len(first) + 3
    assert second_fed == len(second) + 3 - 48
    assert [t for o in second_outs for t in o.token_ids] == solo_greedy(second, 4)


async def test_whole_prompt_cached_still_computes_its_last_block(model_dir, solo_greedy):
    (prompt,) = shared_prefix_prompts(1, 32, 0, seed=4)  # exactly two blocks of 16
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    async with AsyncEngine(EngineConfig(model=model_dir)) as engine:
        runs = []
        for _ in range(2):
            runs.append([out async for out in engine.generate(prompt, params)])
    assert runs[1][-1].num_cached_tokens == 16  # the block holding the last token is recomputed
    for outs in runs:
        assert [t for o in outs for t in o.token_ids] == solo_greedy(prompt, 3)


async def test_no_leak_after_mixed_requests_and_aborts(model_dir):
    rng = random.Random(11)
    prompts = shared_prefix_prompts(24, 20, 6, seed=5)
    config = EngineConfig(model=model_dir, block_size=4, num_kv_blocks=40, max_num_seqs=6)
    async with AsyncEngine(config) as engine:

        async def one(index: int, prompt: list[int]) -> None:
            params = SamplingParams(max_tokens=rng.randint(1, 12), temperature=0, ignore_eos=True)
            cut = rng.randint(0, 6) if index % 3 == 0 else None
            async for out in engine.generate(prompt, params):
                if cut is not None and out.num_output_tokens >= cut:
                    break  # leaving the loop aborts the request

        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        blocks = engine.core.blocks
        blocks.check_integrity(held=[])
        assert blocks.usage == 0 and blocks.num_free_blocks == blocks.num_blocks
        assert blocks.num_cached_blocks > 0 and engine.stats()["prefix_cache_hits"] > 0


@pytest.mark.parametrize("forward", ["transformers", "lean-llama"])
async def test_every_forward_is_exact_after_a_cached_prefix(model_dir, solo_greedy, forward):
    prompts = shared_prefix_prompts(4, 37, 6, seed=9)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    config = EngineConfig(model=model_dir, block_size=8, max_num_batched_tokens=20,
                          forward=forward)
    async with AsyncEngine(config) as engine:
        results = await run_staggered(engine, prompts, params)
        assert engine.stats()["prefix_cache_hits"] >= 3 * 32
    assert results == [solo_greedy(p, 8) for p in prompts]
