"""Continuous batching never changes what a user gets (CASES BUG-01, BUG-02)."""

from __future__ import annotations

import asyncio
import random

import pytest

from aioserve import AsyncEngine, EngineConfig, SamplingParams


async def collect(
    engine: AsyncEngine, prompt, params: SamplingParams, request_id=None
) -> list[int]:
    return [t async for out in engine.generate(prompt, params, request_id) for t in out.token_ids]


def start(
    engine: AsyncEngine, prompt, params: SamplingParams
) -> tuple[asyncio.Task, asyncio.Event]:
    """Stream a request in a task; the event is set at its first output."""
    first = asyncio.Event()

    async def run() -> list[int]:
        ids: list[int] = []
        async for out in engine.generate(prompt, params):
            ids += out.token_ids
            first.set()
        return ids

    return asyncio.create_task(run()), first


async def staggered(engine: AsyncEngine, workload: list[tuple[list[int], int]],
                    join: bool = True) -> list[list[int]]:
    """Greedy tokens of each (prompt, max_tokens), EOS ignored; with ``join``, every third
    request's first output is awaited so the next arrivals join a decoding batch."""
    tasks = []
    for i, (prompt, max_tokens) in enumerate(workload):
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        task, first_output = start(engine, prompt, params)
        tasks.append(task)
        if join and i % 3 == 2:
            await first_output.wait()
    return list(await asyncio.gather(*tasks))


def staggered_workload(seed: int = 7) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    lengths = [1, 60] + [rng.randint(1, 60) for _ in range(14)]
    return [
        ([1] + [rng.randint(3, 511) for _ in range(n - 1)], rng.randint(4, 24)) for n in lengths
    ]


@pytest.mark.parametrize("scheduler", ["fcfs", "static"])
async def test_staggered_requests_equal_their_solo_runs(model_dir, solo_greedy, scheduler):
    workload = staggered_workload()
    config = EngineConfig(
        model=model_dir,
        scheduler=scheduler,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        block_size=8,
    )
    async with AsyncEngine(config) as engine:
        results = await staggered(engine, workload)
        assert engine.stats()["num_free_blocks"] == engine.core.blocks.num_blocks
    for (prompt, max_tokens), got in zip(workload, results):
        assert got == solo_greedy(prompt, max_tokens), f"prompt of {len(prompt)} tokens"


@pytest.mark.parametrize("scheduler", ["fcfs", "static"])
async def test_bug01_alone_together_and_staggered_agree(
    model_dir, tokenizer, solo_greedy, scheduler
):
    prompts = [[1] + list(range(40, 40 + n - 1)) for n in (3, 7, 12, 20)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    expected = [solo_greedy(p, 16) for p in prompts]
    config = EngineConfig(model=model_dir, scheduler=scheduler, max_num_seqs=4)
    async with AsyncEngine(config) as engine:
        alone = [await collect(engine, p, params) for p in prompts]
        together = await asyncio.gather(*(collect(engine, p, params) for p in prompts))
        # staggered: prompt 2 joins at prompt 1's decode step 5, prompt 3 after prompt 1 ends
        first = engine.generate(prompts[0], params)
        got0: list[int] = []
        later: list[asyncio.Task[list[int]]] = []
        async for out in first:
            got0 += out.token_ids
            if len(got0) == 5:
                later.append(asyncio.create_task(collect(engine, prompts[1], params)))
        later.append(asyncio.create_task(collect(engine, prompts[2], params)))
        later.append(asyncio.create_task(collect(engine, prompts[3], params)))
        staggered = [got0] + list(await asyncio.gather(*later))
    assert alone == expected
    assert list(together) == expected
    assert staggered == expected


async def test_bug02_short_and_long_prompt_in_one_static_batch(model_dir, solo_greedy):
    short, long = [1, 300, 301], [1] + list(range(200, 211))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    config = EngineConfig(model=model_dir, scheduler="static", max_num_seqs=2)
    async with AsyncEngine(config) as engine:
        got = await asyncio.gather(collect(engine, short, params), collect(engine, long, params))
    assert list(got) == [solo_greedy(short, 8), solo_greedy(long, 8)]


async def test_chunked_prefill_gives_the_same_tokens(model_dir, solo_greedy):
    prompt = [1] + list(range(100, 159))
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    config = EngineConfig(model=model_dir, max_num_batched_tokens=7, block_size=4)
    async with AsyncEngine(config) as engine:
        got = await collect(engine, prompt, params)
    assert got == solo_greedy(prompt, 10)
