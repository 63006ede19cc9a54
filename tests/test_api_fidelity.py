"""What real clients expect (issue 9): lone surrogates are a 400 (and an error message
on a websocket that stays open), ``GET /v1/models/{id}``, ``null`` means "not set",
integral floats are integers, and the websocket accepts only what HTTP accepts."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from server_support import (
    CHAT_TEMPLATE,
    base_url,
    idle,
    scripted_engine,
    serve,
    sse_events,
    wait_until,
)

from aioserve import AsyncEngine, EngineConfig
from aioserve.server import ServerConfig

SURROGATE_BODY = b'{"model": "m", "prompt": "Once \\ud800 upon", "max_tokens": 3}'


@pytest.fixture
async def server(tokenizer):
    engine = scripted_engine(tokenizer, [300, 301, 302, 303, 304, 305], max_model_len=128)
    config = ServerConfig(served_model_name="m", chat_template=CHAT_TEMPLATE)
    async with serve(engine, config) as srv:
        yield srv, engine


async def post(server, path: str, data: bytes | dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        kw = {"data": data, "headers": {"Content-Type": "application/json"}} if isinstance(
            data, bytes) else {"json": data}
        async with s.post(base_url(server) + path, **kw) as r:
            return r.status, await r.json()


async def test_lone_surrogate_in_prompt_is_a_400_naming_prompt(server):
    srv, engine = server
    status, body = await post(srv, "/v1/completions", SURROGATE_BODY)
    assert status == 400 and body["error"]["param"] == "prompt"
    assert "surrogate" in body["error"]["message"]
    chat = b'{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}'
    status, body = await post(srv, "/v1/chat/completions", chat)
    assert status == 400 and body["error"]["param"] == "messages"
    assert engine.is_running


async def test_lone_surrogate_on_the_websocket_keeps_the_socket(server):
    srv, _ = server
    async with aiohttp.ClientSession() as s, s.ws_connect(base_url(srv) + "/ws") as ws:
        await ws.send_str('{"type": "generate", "id": "a", "prompt": "x\\ud800", "max_tokens": 2}')
        error = await asyncio.wait_for(ws.receive_json(), 30)
        assert (error["type"], error["id"], error["param"]) == ("error", "a", "prompt")
        await ws.send_json({"type": "generate", "id": "b", "prompt": "Once", "max_tokens": 2})
        messages = [await asyncio.wait_for(ws.receive_json(), 30) for _ in range(3)]
        assert messages[-1]["type"] == "done" and messages[-1]["id"] == "b"


async def test_models_retrieve_with_the_openai_client(server):
    srv, _ = server
    client = openai.AsyncOpenAI(base_url=base_url(srv) + "/v1", api_key="x", max_retries=0)
    model = await client.models.retrieve("m")
    assert model.id == "m" and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("other")


async def test_null_fields_mean_not_set(server):
    srv, _ = server
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "max_completion_tokens": None, "stream": True, "stream_options": None,
            "temperature": None, "top_logprobs": None, "seed": None, "n": None}
    async with (aiohttp.ClientSession() as s,
                s.post(base_url(srv) + "/v1/chat/completions", json=body) as r):
        assert r.status == 200
        events = await sse_events(r)
    assert events[-1] == "[DONE]"
    finish = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]]
    assert finish[-1] == "length"  # max_tokens 3, not the rest of the context
    tokens = [e for e in events[1:-1] if e["choices"][0]["delta"].get("content")]
    assert len(tokens) == 3
    status, out = await post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2,
                                                      "stream": False,
                                                      "stream_options": {"include_usage": None}})
    assert status == 200 and out["usage"]["completion_tokens"] == 2


async def test_integral_floats_are_integers(server):
    srv, _ = server
    status, out = await post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 3.0,
                                                      "n": 2.0, "seed": 7.0, "top_k": 5.0})
    assert status == 200, out
    assert len(out["choices"]) == 2 and out["usage"]["completion_tokens"] == 6
    status, out = await post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2.5})
    assert status == 400 and out["error"]["param"] == "max_tokens"


async def test_websocket_fields_behave_as_on_http(server):
    srv, engine = server
    async with aiohttp.ClientSession() as s, s.ws_connect(base_url(srv) + "/ws") as ws:
        async def ask(message: dict) -> dict:
            await ws.send_json({"type": "generate", "prompt": "Once", **message})
            return await asyncio.wait_for(ws.receive_json(), 30)

        refused = await ask({"id": "e", "echo": True})
        assert (refused["type"], refused["param"]) == ("error", "echo")
        refused = await ask({"id": "n", "n": 2})
        assert (refused["type"], refused["param"]) == ("error", "n")
    await wait_until(lambda: idle(engine))


async def test_websocket_logprobs_as_in_completions(model_dir):
    engine = AsyncEngine(EngineConfig(model=model_dir, num_kv_blocks=32))
    async with serve(engine) as srv, aiohttp.ClientSession() as s:
        body = {"prompt": "Once", "max_tokens": 2, "logprobs": 2, "temperature": 0}
        async with s.post(base_url(srv) + "/v1/completions", json=body) as r:
            http = (await r.json())["choices"][0]["logprobs"]
        async with s.ws_connect(base_url(srv) + "/ws") as ws:
            await ws.send_json({"type": "generate", "id": "l", **body})
            tokens, top = [], []
            while (message := await asyncio.wait_for(ws.receive_json(), 30))["type"] == "token":
                tokens += message["logprobs"]["tokens"]
                top += message["logprobs"]["top_logprobs"]
    assert message["type"] == "done"
    assert tokens == http["tokens"] and top == http["top_logprobs"]


async def test_websocket_cancel_done_has_total_tokens_and_unknown_cancel_is_answered(server):
    srv, engine = server
    async with aiohttp.ClientSession() as s, s.ws_connect(base_url(srv) + "/ws") as ws:
        await ws.send_json({"type": "cancel", "id": "nobody"})
        answer = await asyncio.wait_for(ws.receive_json(), 30)
        assert (answer["type"], answer["id"], answer["code"]) == ("error", "nobody", "unknown_id")
        await ws.send_json({"type": "generate", "id": "r", "prompt": "Once", "max_tokens": 100,
                            "ignore_eos": True})
        first = await asyncio.wait_for(ws.receive_json(), 30)
        assert first["type"] == "token"
        await ws.send_json({"type": "cancel", "id": "r"})
        while (message := await asyncio.wait_for(ws.receive_json(), 30))["type"] == "token":
            pass
        assert message["finish_reason"] == "abort"
        usage = message["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    await wait_until(lambda: idle(engine))


async def test_websocket_model_and_prompt_list_refused_as_on_http(server):
    srv, engine = server
    async with aiohttp.ClientSession() as s, s.ws_connect(base_url(srv) + "/ws") as ws:
        await ws.send_json({"type": "generate", "id": "m", "prompt": "hi", "model": "nope"})
        error = await asyncio.wait_for(ws.receive_json(), 30)
        assert (error["type"], error["param"], error["code"]) == ("error", "model",
                                                                   "model_not_found")
        await ws.send_json({"type": "generate", "id": "p", "prompt": ["a", "b"]})
        error = await asyncio.wait_for(ws.receive_json(), 30)
        assert (error["type"], error["param"]) == ("error", "prompt")
        assert "one generate message per prompt" in error["message"]
    assert idle(engine)


async def test_chat_limit_errors_name_the_field_sent(server):
    srv, _ = server
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    status, body = await post(srv, "/v1/chat/completions", {**chat, "max_completion_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_completion_tokens"
    assert body["error"]["message"].startswith("max_completion_tokens")
    status, body = await post(srv, "/v1/chat/completions",
                              {**chat, "max_completion_tokens": 2, "max_tokens": 10**6})
    assert status == 400 and body["error"]["param"] == "max_tokens"
