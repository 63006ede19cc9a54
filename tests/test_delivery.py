"""Delivery to consumers: one RequestOutput per token even when a consumer lags, and the
one-consumer DeltaQueue's wake-up rules."""

from __future__ import annotations

import asyncio

import pytest

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.engine.delta_queue import DeltaQueue

PROMPT = "Once upon a time"


async def test_lagging_consumer_sees_every_delta_once(model_dir, tokenizer):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    longer = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    config = EngineConfig(model=model_dir, num_kv_blocks=32, block_size=16)
    async with AsyncEngine(config) as engine:
        lagging = engine.generate(PROMPT, params)
        outputs = [await lagging.__anext__()]
        # another request runs to its end while `lagging` is not read: its request ends
        # (12 < 30 tokens) and every delta of it waits in its queue
        async for _ in engine.generate("One day", longer):
            pass
        assert engine.stats()["num_running"] == 0
        outputs += [out async for out in lagging]
    assert [len(out.token_ids) for out in outputs] == [1] * 12
    assert [out.num_output_tokens for out in outputs] == list(range(1, 13))
    assert [out.finished for out in outputs] == [False] * 11 + [True]
    assert outputs[-1].finish_reason == "length" and outputs[0].finish_reason is None
    assert all(out.num_prompt_tokens == outputs[0].num_prompt_tokens for out in outputs)
    assert outputs[-1].metrics is not None and outputs[-1].metrics.finished_time is not None
    prompt_ids = tokenizer(PROMPT).input_ids
    ids = [token for out in outputs for token in out.token_ids]
    full = tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)
    expected = full[len(tokenizer.decode(prompt_ids, skip_special_tokens=True)) :]
    assert "".join(out.text for out in outputs) == expected


async def test_wait_completes_at_once_when_an_item_is_queued():
    queue: DeltaQueue[int] = DeltaQueue()
    queue.put_nowait(1)
    queue.put_nowait(2)
    assert queue.wait().done()
    assert [await queue.get(), await queue.get()] == [1, 2]
    waiter = queue.wait()
    assert not waiter.done()
    queue.put_nowait(3)
    assert waiter.done() and list(queue.items) == [3]


async def test_one_consumer_at_a_time_and_a_cancelled_wait_frees_the_queue():
    queue: DeltaQueue[int] = DeltaQueue()
    waiter = queue.wait()
    with pytest.raises(RuntimeError, match="one consumer"):
        queue.wait()
    waiter.cancel()  # as when the waiting consumer's task is cancelled
    again = queue.wait()
    queue.put_nowait(7)
    assert again.done() and await queue.get() == 7 and queue.empty()
    with pytest.raises(asyncio.QueueEmpty):
        queue.get_nowait()
