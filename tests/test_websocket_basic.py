"""The websocket endpoint on a real server on 127.0.0.1 (issue 2)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp.test_utils import TestServer

from aioserve import AsyncEngine, EngineConfig
from aioserve.server import create_app

PROMPTS = {"r1": [1, 403, 407, 261, 378], "r2": [1, 300, 301], "r3": [1] + list(range(60, 80))}
MAX_TOKENS = {"r1": 30, "r2": 12, "r3": 20}


async def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_three_interleaved_requests_on_one_socket(model_dir, solo_greedy):
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=4))
    async with (
        TestServer(create_app(engine), host="127.0.0.1") as server,
        aiohttp.ClientSession() as http,http.ws_connect(server.make_url("/ws")) as ws
    ):
        for rid, prompt in PROMPTS.items():
            await ws.send_json(
                {
                    "type": "generate",
                    "id": rid,
                    "prompt": prompt,
                    "max_tokens": MAX_TOKENS[rid],
                    "temperature": 0,
                    "ignore_eos": True,
                }
            )
        tokens: dict[str, list[int]] = {rid: [] for rid in PROMPTS}
        done: dict[str, dict] = {}
        order: list[str] = []
        while len(done) < len(PROMPTS):
            message = await asyncio.wait_for(ws.receive_json(), timeout=30)
            order.append(message["id"])
            if message["type"] == "token":
                tokens[message["id"]] += message["token_ids"]
            else:
                assert message["type"] == "done", message
                done[message["id"]] = message
    for rid, prompt in PROMPTS.items():
        assert tokens[rid] == solo_greedy(prompt, MAX_TOKENS[rid])
        assert done[rid]["finish_reason"] == "length"
        usage = done[rid]["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
            len(prompt),
            MAX_TOKENS[rid],
        )
    r2_done = max(i for i, rid in enumerate(order) if rid == "r2")
    assert {"r1", "r3"} <= set(order[:r2_done])  # the three streams really interleaved


async def test_closed_socket_aborts_its_requests(model_dir):
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=4))
    async with (
        TestServer(create_app(engine), host="127.0.0.1") as server,
        aiohttp.ClientSession() as http,
    ):
        baseline = None
        async with http.ws_connect(server.make_url("/ws")) as ws:
            baseline = engine.core.blocks.num_blocks
            for rid in ("a", "b"):
                await ws.send_json(
                    {
                        "type": "generate",
                        "id": rid,
                        "prompt": "Once upon a time",
                        "max_tokens": 400,
                        "ignore_eos": True,
                    }
                )
            message = await ws.receive_json()
            assert message["type"] == "token"
            assert engine.stats()["num_running"] == 2
        await wait_until(lambda: engine.stats()["num_running"] == 0)
        assert engine.stats()["num_free_blocks"] == baseline


async def test_bad_messages_get_errors_and_the_socket_keeps_working(model_dir):
    engine = AsyncEngine(EngineConfig(model=model_dir))
    async with (
        TestServer(create_app(engine), host="127.0.0.1") as server,
        aiohttp.ClientSession() as http,
    ):
        async with http.ws_connect(server.make_url("/ws")) as ws:
            await ws.send_str("not json")
            assert (await ws.receive_json())["type"] == "error"
            await ws.send_json({"type": "generate", "id": "x", "prompt": "hi", "max_tokens": 0})
            error = await ws.receive_json()
            assert (
                error["type"] == "error" and error["id"] == "x" and "max_tokens" in error["message"]
            )
            await ws.send_json({"type": "generate", "id": "y", "prompt": "", "max_tokens": 3})
            error = await ws.receive_json()
            assert error["type"] == "error" and "empty" in error["message"]
            await ws.send_json({"type": "generate", "id": "ok", "prompt": "Once", "max_tokens": 3})
            kinds = []
            while not kinds or kinds[-1] != "done":
                kinds.append((await ws.receive_json())["type"])
            assert kinds == ["token", "token", "token", "done"]
        async with http.get(server.make_url("/health")) as response:
            assert response.status == 200
