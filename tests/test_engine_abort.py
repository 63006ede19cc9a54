"""Leaving a stream early aborts the request and frees its slot and KV blocks (BUG-04)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from server_support import wait_until

from aioserve import AsyncEngine, EngineConfig, EngineNotRunningError, SamplingParams

LONG = SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)


def config(model_dir: str, **kw) -> EngineConfig:
    return EngineConfig(model=model_dir, num_kv_blocks=32, block_size=16, **kw)


async def test_break_out_of_the_stream_frees_everything(model_dir):
    async with AsyncEngine(config(model_dir)) as engine:
        baseline = engine.stats()["num_free_blocks"]
        seen = 0
        async with contextlib.aclosing(engine.generate("Once upon a time", LONG)) as stream:
            async for out in stream:
                seen += len(out.token_ids)
                if seen == 3:
                    assert engine.stats()["num_free_blocks"] < baseline
                    break
        stats = engine.stats()
        assert (stats["num_running"], stats["num_waiting"]) == (0, 0)
        assert stats["num_free_blocks"] == baseline
        engine.core.blocks.check_integrity(held=[])


async def test_cancelled_consumer_task_aborts_its_request(model_dir):
    async with AsyncEngine(config(model_dir)) as engine:
        baseline = engine.stats()["num_free_blocks"]
        got_tokens = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.generate("Once upon a time", LONG):
                got_tokens.set()

        task = asyncio.create_task(consume())
        await got_tokens.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.stats()["num_running"] == 0
        assert engine.stats()["num_free_blocks"] == baseline


async def test_queued_request_cancelled_is_never_prefilled(model_dir):
    async with AsyncEngine(config(model_dir, max_num_seqs=1)) as engine:
        baseline = engine.stats()["num_free_blocks"]
        running = engine.generate("Once upon a time", LONG, request_id="long")
        first = await running.__anext__()
        assert first.token_ids
        queued = engine.generate("One day", LONG, request_id="queued")
        pending = asyncio.create_task(queued.__anext__())
        await wait_until(lambda: engine.stats()["num_waiting"] == 1)
        engine.abort("queued")
        final = await pending
        assert final.finished and final.finish_reason == "abort" and final.token_ids == []
        assert final.metrics.first_scheduled_step is None  # never prefilled
        await running.aclose()
        assert engine.stats()["num_free_blocks"] == baseline
        # the engine still serves
        outs = [o async for o in engine.generate("Once", SamplingParams(max_tokens=3))]
        assert outs[-1].num_output_tokens == 3


async def test_engine_abort_ends_a_running_stream_with_abort(model_dir):
    async with AsyncEngine(config(model_dir)) as engine:
        outputs = []
        async for out in engine.generate("Once upon a time", LONG, request_id="r"):
            outputs.append(out)
            if len(outputs) == 2:
                engine.abort("r")
        assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
        assert engine.stats()["num_free_blocks"] == engine.core.blocks.num_blocks


async def test_requests_need_a_running_engine_and_unique_ids(model_dir):
    engine = AsyncEngine(config(model_dir))
    with pytest.raises(EngineNotRunningError):
        await engine.generate("hi").__anext__()
    async with engine:
        stream = engine.generate("Once upon a time", LONG, request_id="dup")
        await stream.__anext__()
        with pytest.raises(ValueError, match="request_id"):
            await engine.generate("again", request_id="dup").__anext__()
        await stream.aclose()
