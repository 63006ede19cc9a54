"""CASES BUG-25: an exception inside a model step reaches every transport as an error
within a second (HTTP 500 JSON, SSE error event, websocket error message, EngineError
in Python); requests outside the failed batch finish; the engine goes on serving."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest
from scripted_runner import ScriptedRunner
from server_support import base_url, idle, serve, wait_until

from aioserve import AsyncEngine, EngineConfig, EngineError, SamplingParams

LONG = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True}


class ArmedRunner(ScriptedRunner):
    """Fails its next step once :meth:`arm` is called; steps take ``delay`` seconds."""

    def __init__(self, *args, delay: float = 0.002, **kw) -> None:
        super().__init__(*args, **kw)
        self.delay = delay

    def arm(self) -> None:
        self.fail_on_step = self.steps

    async def step(self, batch):
        await asyncio.sleep(self.delay)
        return await super().step(batch)


async def test_bug25_step_failure_reaches_every_transport(tokenizer):
    runner = ArmedRunner([300, 301], num_kv_blocks=64)
    engine = AsyncEngine(EngineConfig(model="scripted", max_num_seqs=4), runner=runner,
                         tokenizer=tokenizer)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        sse = await s.post(url + "/v1/completions", json={**LONG, "stream": True})
        await sse.content.readline()
        plain = asyncio.create_task(s.post(url + "/v1/completions", json=LONG))
        ws = await s.ws_connect(url + "/ws")
        await ws.send_json({"type": "generate", "id": "w", **LONG})
        assert (await ws.receive_json(timeout=30))["type"] == "token"
        python = engine.generate("Hello", SamplingParams(max_tokens=300, ignore_eos=True))
        await python.__anext__()
        await wait_until(lambda: engine.stats()["num_running"] == 4)
        waiting = engine.generate("Hi", SamplingParams(max_tokens=5, ignore_eos=True))
        waiting_first = asyncio.create_task(waiting.__anext__())
        await wait_until(lambda: engine.stats()["num_waiting"] == 1)

        runner.arm()
        with pytest.raises(EngineError, match="injected failure"):
            async for _ in python:
                pass
        error_event = None
        async for raw in sse.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                assert line != "data: [DONE]"
                error_event = json.loads(line[6:])
        assert "injected failure" in error_event["error"]["message"]
        response = await asyncio.wait_for(plain, 30)
        assert response.status == 500
        assert (await response.json())["error"]["code"] == "engine_error"
        while (msg := await ws.receive_json(timeout=30))["type"] == "token":
            pass
        assert msg["type"] == "error" and "injected failure" in msg["message"]

        # the waiting request was not in the failed batch: it finishes normally
        outputs = [await waiting_first] + [out async for out in waiting]
        assert outputs[-1].finish_reason == "length" and outputs[-1].num_output_tokens == 5
        await ws.close()
        await wait_until(lambda: idle(engine))
        async with s.get(url + "/health") as r:
            assert r.status == 200
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        again = await client.completions.create(model="scripted", prompt="hi", max_tokens=3)
        assert again.usage.completion_tokens == 3


async def test_openai_client_raises_on_an_sse_error_event(tokenizer):
    runner = ArmedRunner([300], num_kv_blocks=64)
    engine = AsyncEngine(EngineConfig(model="scripted"), runner=runner, tokenizer=tokenizer)
    async with serve(engine) as server:
        client = openai.AsyncOpenAI(base_url=base_url(server) + "/v1", api_key="x",
                                    max_retries=0)
        args = dict(model="scripted", prompt="hi", max_tokens=300,
                    extra_body={"ignore_eos": True})
        stream = await client.completions.create(stream=True, **args)
        with pytest.raises(openai.APIError, match="injected failure"):
            async for _ in stream:
                if not runner.fail_on_step:
                    runner.arm()
        with pytest.raises(openai.InternalServerError):
            runner.arm()
            await client.completions.create(**args)


async def test_health_is_503_and_requests_fail_fast_when_the_engine_is_down(tokenizer):
    engine = AsyncEngine(EngineConfig(model="scripted"), runner=ScriptedRunner([300]),
                         tokenizer=tokenizer)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        await engine.shutdown()
        async with s.get(url + "/health") as r:
            assert r.status == 503
        async with s.post(url + "/v1/completions", json={"prompt": "hi"}) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == "engine_not_running"
        async with s.get(url + "/metrics") as r:
            assert r.status == 200
