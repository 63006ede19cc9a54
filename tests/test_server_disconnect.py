"""CASES BUG-04 over the server: a client that leaves (SSE, websocket, non-streaming,
n=2, queued) has its requests aborted within two engine steps and its KV blocks
freed; 200 connect/stream/disconnect cycles leak nothing."""

from __future__ import annotations

import asyncio

import aiohttp
from scripted_runner import ScriptedRunner
from server_support import base_url, idle, serve, wait_until

from aioserve import AsyncEngine, EngineConfig

LONG = {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True}


class SlowRunner(ScriptedRunner):
    """A scripted runner whose steps take ``delay`` seconds (so requests are mid-way
    when clients leave)."""

    def __init__(self, *args, delay: float = 0.005, **kw) -> None:
        super().__init__(*args, **kw)
        self.delay = delay

    async def step(self, batch):
        await asyncio.sleep(self.delay)
        return await super().step(batch)


def make_engine(tokenizer, *, max_num_seqs: int = 8, delay: float = 0.005) -> AsyncEngine:
    runner = SlowRunner([300, 301, 302], num_kv_blocks=32, block_size=16, delay=delay)
    return AsyncEngine(EngineConfig(model="scripted", max_num_seqs=max_num_seqs),
                       runner=runner, tokenizer=tokenizer)


async def until_aborted(engine: AsyncEngine, steps_at_leave: int, limit: int = 2) -> None:
    await wait_until(lambda: idle(engine))
    assert engine.runner.steps - steps_at_leave <= limit


async def test_sse_client_closing_mid_stream_aborts_within_two_steps(tokenizer):
    engine = make_engine(tokenizer)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        baseline = engine.stats()["num_free_blocks"]
        response = await s.post(base_url(server) + "/v1/completions", json={**LONG,
                                                                            "stream": True})
        for _ in range(3):
            await response.content.readline()
        assert engine.stats()["num_running"] == 1
        steps = engine.runner.steps
        response.close()
        await until_aborted(engine, steps)
        assert engine.stats()["num_free_blocks"] == baseline


async def test_websocket_close_and_cancel_abort(tokenizer):
    engine = make_engine(tokenizer)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        async with s.ws_connect(base_url(server) + "/ws") as ws:
            await ws.send_json({"type": "generate", "id": "a", **LONG})
            await ws.send_json({"type": "generate", "id": "b", **LONG})
            seen = set()
            while seen != {"a", "b"}:
                seen.add((await ws.receive_json(timeout=30))["id"])
            await ws.send_json({"type": "cancel", "id": "a"})
            while True:  # the cancel is confirmed in-band; b goes on
                msg = await ws.receive_json(timeout=30)
                if msg["type"] == "done":
                    assert (msg["id"], msg["finish_reason"]) == ("a", "abort")
                    break
            assert engine.stats()["num_running"] == 1
            steps = engine.runner.steps
        await until_aborted(engine, steps)  # closing the socket aborted b


async def test_non_streaming_client_leaving_aborts_with_or_without_handler_cancellation(
    tokenizer,
):
    for cancellation in (True, False):
        engine = make_engine(tokenizer)
        async with serve(engine, handler_cancellation=cancellation) as server, \
                aiohttp.ClientSession() as s:
            post = asyncio.create_task(s.post(base_url(server) + "/v1/completions", json=LONG))
            await wait_until(lambda e=engine: e.stats()["num_running"] == 1)
            await asyncio.sleep(0.1)  # the scenario: the client gives up after 100 ms
            steps = engine.runner.steps
            post.cancel()
            # without aiohttp's handler cancellation the server's watch polls every 50 ms
            await until_aborted(engine, steps, limit=2 if cancellation else 40)


async def test_n2_stream_disconnect_stops_both_sequences(tokenizer):
    engine = make_engine(tokenizer)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        response = await s.post(base_url(server) + "/v1/completions",
                                json={**LONG, "n": 2, "stream": True})
        await response.content.readline()
        assert engine.stats()["num_running"] == 2
        steps = engine.runner.steps
        response.close()
        await until_aborted(engine, steps)


async def test_queued_request_cancelled_before_admission_is_never_prefilled(tokenizer):
    engine = make_engine(tokenizer, max_num_seqs=1)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        long = await s.post(url + "/v1/completions", json={**LONG, "stream": True})
        await long.content.readline()
        queued = await s.post(url + "/v1/completions",
                              json={**LONG, "stream": True, "request_id": "queued"})
        async with s.ws_connect(url + "/ws") as ws:
            await ws.send_json({"type": "generate", "id": "q2", **LONG})
            await wait_until(lambda: engine.stats()["num_waiting"] == 2)
            await ws.send_json({"type": "cancel", "id": "q2"})
            assert (await ws.receive_json(timeout=30))["finish_reason"] == "abort"
        queued.close()
        await wait_until(lambda: engine.stats()["num_waiting"] == 0)
        assert engine.stats()["num_running"] == 1
        long.close()
        await wait_until(lambda: idle(engine))
        assert len(engine.runner.prefilled_ids) == 1  # only the long job ever ran


async def test_duplicate_request_id_is_a_400_while_the_first_runs(tokenizer):
    engine = make_engine(tokenizer)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        url = base_url(server) + "/v1/completions"
        first = await s.post(url, json={**LONG, "stream": True, "request_id": "same"})
        await first.content.readline()
        async with s.post(url, json={**LONG, "request_id": "same"}) as r:
            error = (await r.json())["error"]
        assert r.status == 400 and error["param"] == "request_id"
        # the id the client sent, not the engine's (cmpl-same-0)
        assert error["message"] == ("request_id 'same' (the request_id field or X-Request-Id "
                                    "header) is in use by a request still running")
        async with s.post(url, json=LONG, headers={"X-Request-Id": "same"}) as r:
            error = (await r.json())["error"]
        assert r.status == 400 and error["message"].startswith("request_id 'same' ")
        first.close()
        await wait_until(lambda: idle(engine))
        async with s.post(url, json={**LONG, "max_tokens": 2, "request_id": "same"}) as r:
            assert r.status == 200


async def test_200_cycles_of_connect_stream_disconnect_leak_nothing(tokenizer):
    engine = make_engine(tokenizer, delay=0.0005)
    async with serve(engine) as server:
        url = base_url(server)
        baseline = engine.stats()["num_free_blocks"]
        tasks_before = len(asyncio.all_tasks())
        for cycle in range(200):
            async with aiohttp.ClientSession() as s:
                if cycle % 2 == 0:
                    r = await s.post(url + "/v1/completions", json={**LONG, "stream": True})
                    await r.content.readline()
                    r.close()
                else:
                    ws = await s.ws_connect(url + "/ws")
                    await ws.send_json({"type": "generate", "id": "x", **LONG})
                    await ws.receive_json(timeout=30)
                    await ws.close()
        await wait_until(lambda: idle(engine))
        assert engine.stats()["num_free_blocks"] == baseline
        engine.core.blocks.check_integrity(held=[])
        await wait_until(lambda: len(asyncio.all_tasks()) <= tasks_before)
        assert engine._delivery.streams == {}
