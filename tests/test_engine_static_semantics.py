"""Static vs continuous batching on the article's example (A=100, B=20, C=50, D=200, E=30)."""

from __future__ import annotations

import asyncio

import pytest

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.outputs import RequestOutput

LENGTHS = {"A": 100, "B": 20, "C": 50, "D": 200, "E": 30}


async def last_output(
    engine: AsyncEngine, name: str, first: asyncio.Event | None = None
) -> RequestOutput:
    params = SamplingParams(max_tokens=LENGTHS[name], temperature=0, ignore_eos=True)
    outputs = []
    async for out in engine.generate([1, 403, 407, 261, 378], params, request_id=name):
        outputs.append(out)
        if first is not None:
            first.set()
    assert outputs and outputs[-1].finished
    return outputs[-1]


async def run_article_example(model_dir: str, scheduler: str) -> dict[str, RequestOutput]:
    config = EngineConfig(model=model_dir, scheduler=scheduler, max_num_seqs=4)
    async with AsyncEngine(config) as engine:
        started = asyncio.Event()
        tasks = {
            n: asyncio.create_task(last_output(engine, n, started if n == "A" else None))
            for n in "ABCD"
        }
        await started.wait()  # E arrives just after the batch starts
        tasks["E"] = asyncio.create_task(last_output(engine, "E"))
        return {name: await task for name, task in tasks.items()}


@pytest.mark.parametrize("scheduler", ["static", "fcfs"])
async def test_when_e_is_admitted(model_dir, scheduler):
    outs = await run_article_example(model_dir, scheduler)
    steps = {n: (o.metrics.first_scheduled_step, o.metrics.finished_step) for n, o in outs.items()}
    assert all(outs[n].num_output_tokens == LENGTHS[n] for n in LENGTHS)
    assert all(steps[n][0] == 0 for n in "ABCD")
    e_admitted = steps["E"][0]
    if scheduler == "static":
        assert e_admitted == steps["D"][1] == 200  # only after the longest, D, finished
    else:
        assert e_admitted == steps["B"][1] == 20  # in B's slot, right after B finished
        assert steps["E"][1] == 20 + 30
