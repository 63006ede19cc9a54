"""SIGTERM drains as vLLM and TGI do (issue 9): new requests and /health get 503, queued
requests end with an error event at once, running ones finish within the timeout, and
after it every remaining stream ends with an error event; none is cut mid-body."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
from scripted_runner import ScriptedRunner
from server_support import scripted_engine, sse_events, wait_until

from aioserve.commands.serve import serve
from aioserve.runners.base import RunnerOutput, ScheduledBatch
from aioserve.server import create_app


class GatedRunner(ScriptedRunner):
    """A scripted runner whose steps wait for the test to open the gate."""

    def __init__(self) -> None:
        super().__init__([300, 301, 302], num_kv_blocks=256)
        self.gate = asyncio.Event()
        self.gate.set()

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        await self.gate.wait()
        return await super().step(batch)


async def start(tokenizer, shutdown_timeout: float):
    engine = scripted_engine(tokenizer, [300], max_num_seqs=4)
    runner = GatedRunner()
    engine.runner = runner
    app = create_app(engine)
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(app, "127.0.0.1", 0, shutdown_timeout, on_ready=ready.set_result))
    return engine, runner, task, await asyncio.wait_for(ready, 30)


async def open_streams(session, url: str, count: int) -> list[aiohttp.ClientResponse]:
    body = {"prompt": "Once upon a time", "max_tokens": 50, "ignore_eos": True, "stream": True}
    return list(await asyncio.gather(
        *(session.post(url + "/v1/completions", json=body) for _ in range(count))))


async def test_sigterm_refuses_new_work_ends_queued_and_lets_running_finish(tokenizer):
    engine, runner, task, url = await start(tokenizer, shutdown_timeout=600)
    async with aiohttp.ClientSession() as session:
        responses = await open_streams(session, url, 12)  # 4 slots: 4 run, 8 queued
        await wait_until(lambda: engine.stats()["num_running"] == 4, 30)
        runner.gate.clear()  # the running requests wait here, mid-generation
        os.kill(os.getpid(), signal.SIGTERM)
        await wait_until(lambda: engine.is_draining, 30)
        async with session.get(url + "/health") as health:
            assert health.status == 503
        body = {"prompt": "late", "max_tokens": 2}
        async with session.post(url + "/v1/completions", json=body) as late:
            assert late.status == 503
            assert (await late.json())["error"]["code"] == "engine_not_running"
        runner.gate.set()
        results = await asyncio.gather(*(sse_events(r) for r in responses))
        await asyncio.wait_for(task, 60)
    done = [events for events in results if events[-1] == "[DONE]"]
    errors = [events for events in results if isinstance(events[-1], dict)
              and "error" in events[-1]]
    assert len(done) == 4 and len(errors) == 8
    for events in done:
        assert sum(1 for e in events[:-1] if e["choices"][0]["text"]) == 50
    for events in errors:  # queued: never started, ended with an error event
        assert len(events) == 1


async def test_after_the_timeout_every_stream_ends_with_an_error_event(tokenizer):
    engine, runner, task, url = await start(tokenizer, shutdown_timeout=0.2)
    async with aiohttp.ClientSession() as session:
        responses = await open_streams(session, url, 6)
        await wait_until(lambda: engine.stats()["num_running"] == 4, 30)
        runner.gate.clear()  # the running requests never finish
        os.kill(os.getpid(), signal.SIGTERM)
        results = await asyncio.gather(*(sse_events(r) for r in responses))
        await asyncio.wait_for(task, 60)
    for events in results:
        assert events[-1] != "[DONE]"
        assert events[-1]["error"]["code"] == "engine_not_running"
