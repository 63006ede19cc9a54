"""One request's failure never stops the engine nor harms its batch-mates: a raising
detokenizer, a step loop that dies, a drain before shutdown."""

from __future__ import annotations

import asyncio

import pytest

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.detokenizer import IncrementalDetokenizer
from aioserve.errors import EngineError, EngineNotRunningError

PROMPTS = ["Once upon a time", "The cat", "Lily and Tom went", "One day", "A big dog",
           "The sun was", "Sara had a", "Ben liked to"]
PARAMS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


class RaisingDetokenizer(IncrementalDetokenizer):
    """Fails on its third token, as a broken detokenizer or stop check would."""

    def add(self, token_id: int) -> str:
        if len(self._token_ids) == 2:
            raise RuntimeError("injected detokenizer fault")
        return super().add(token_id)


def config(model_dir: str) -> EngineConfig:
    return EngineConfig(model=model_dir, max_num_seqs=8, num_kv_blocks=64)


async def collect(stream) -> tuple[list[int], str, BaseException | None]:
    ids, text = [], ""
    while True:
        item = await stream.queue.get()
        if isinstance(item, BaseException):
            return ids, text, item
        ids += item.token_ids
        text += item.text
        if item.finished:
            return ids, text, None


async def test_a_raising_detokenizer_ends_only_its_request(model_dir, tokenizer, solo_greedy):
    async with AsyncEngine(config(model_dir)) as engine:
        streams = [engine.add_request(p, PARAMS) for p in PROMPTS]
        bad = streams[3]
        bad.detokenizer = RaisingDetokenizer(
            tokenizer.backend_tokenizer, bad.request.prompt_token_ids
        )
        results = await asyncio.gather(*(collect(s) for s in streams))
        for index, (ids, text, error) in enumerate(results):
            if index == 3:
                assert isinstance(error, EngineError) and "injected" in str(error)
                continue
            assert error is None
            prompt_ids = tokenizer(PROMPTS[index]).input_ids
            assert ids == solo_greedy(prompt_ids, PARAMS.max_tokens)
            assert text == tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)[
                len(tokenizer.decode(prompt_ids, skip_special_tokens=True)):]
        assert engine.is_running
        stats = engine.stats()
        assert (stats["num_running"], stats["num_waiting"]) == (0, 0)
        engine.core.blocks.check_integrity(held=[])
        # and the engine serves the next request
        outs = [o async for o in engine.generate(PROMPTS[0], PARAMS)]
        assert outs[-1].finish_reason == "length"


async def test_a_dead_step_loop_ends_every_stream_and_reports_not_running(model_dir):
    async with AsyncEngine(config(model_dir)) as engine:
        long = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
        streams = [engine.add_request(p, long) for p in PROMPTS[:4]]
        first = await streams[0].queue.get()
        assert not isinstance(first, BaseException)

        def broken_schedule() -> None:
            raise SystemError("injected bug in the step loop itself")

        assert engine.step_loop is not None
        engine.step_loop.start_step = broken_schedule  # type: ignore[method-assign]
        results = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in streams)), 60)
        assert all(isinstance(error, EngineError) for _, _, error in results)
        assert not engine.is_running
        with pytest.raises(EngineNotRunningError):
            engine.add_request("Once", PARAMS)


async def test_drain_refuses_new_work_ends_queued_and_finishes_running(model_dir, tokenizer,
                                                                       solo_greedy):
    cfg = EngineConfig(model=model_dir, max_num_seqs=2, num_kv_blocks=64)
    async with AsyncEngine(cfg) as engine:
        streams = [engine.add_request(p, PARAMS) for p in PROMPTS[:6]]
        first = await streams[0].queue.get()  # two are running now, four queued
        assert not isinstance(first, BaseException)
        engine.drain()
        with pytest.raises(EngineNotRunningError):
            engine.add_request("Once", PARAMS)
        assert await engine.wait_idle(120)
        results = await asyncio.gather(*(collect(s) for s in streams[1:]))
        finished = [r for r in results if r[2] is None]
        refused = [r for r in results if isinstance(r[2], EngineNotRunningError)]
        assert len(finished) == 1 and len(refused) == 4  # streams[0] and [1] ran
        assert first.token_ids == solo_greedy(tokenizer(PROMPTS[0]).input_ids, 1)
        assert all(ids == [] for ids, _, _ in refused)
        engine.core.blocks.check_integrity(held=[])
