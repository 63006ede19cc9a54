"""Bad input harms nothing (CASES BUG-12, 13, 14, 24 and the issue's list): each gets a
4xx with an OpenAI-style JSON error naming the field, the engine is never touched,
batch-mates finish, and the next normal request succeeds."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from server_support import base_url, idle, scripted_engine, serve, sse_events, wait_until

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.server import ServerConfig

OK = {"prompt": "Once upon a time", "max_tokens": 4}

#: (body, expected status, expected error.param)
BAD_BODIES = [
    (b"{not json", 400, None),
    (b'{"prompt": "\xff\xfe caf\xe9"}', 400, None),
    (b"[1, 2]", 400, None),
    (b"", 400, None),
    (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", 400, None),
    (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    (b'{"prompt": 123}', 400, "prompt"),
    (b'{"prompt": ""}', 400, "prompt"),
    (b'{"prompt": [""]}', 400, "prompt"),
    (b'{"prompt": []}', 400, "prompt"),
    (b'{"prompt": [1, "a"]}', 400, "prompt"),
    (b'{"prompt": [99999]}', 400, "prompt"),
    (b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
    (b'{"prompt": "hi", "max_tokens": -1}', 400, "max_tokens"),
    (b'{"prompt": "hi", "max_tokens": 1000000000}', 400, "max_tokens"),
    (b'{"prompt": "hi", "max_tokens": "5"}', 400, "max_tokens"),
    (b'{"prompt": "hi", "max_tokens": true}', 400, "max_tokens"),
    (b'{"prompt": "hi", "temperature": -1}', 400, "temperature"),
    (b'{"prompt": "hi", "temperature": NaN}', 400, "temperature"),
    (b'{"prompt": "hi", "temperature": Infinity}', 400, "temperature"),
    (b'{"prompt": "hi", "top_p": 0}', 400, "top_p"),
    (b'{"prompt": "hi", "top_p": 1.5}', 400, "top_p"),
    (b'{"prompt": "hi", "top_k": -2}', 400, "top_k"),
    (b'{"prompt": "hi", "seed": 100000000000000000000000}', 400, "seed"),
    (b'{"prompt": "hi", "n": 0}', 400, "n"),
    (b'{"prompt": "hi", "stop": [1]}', 400, "stop"),
    (b'{"prompt": "hi", "stream": "yes"}', 400, "stream"),
    (b'{"prompt": "hi", "logprobs": 99}', 400, "logprobs"),
    (b'{"prompt": "hi", "echo": true}', 400, "echo"),
    (b'{"prompt": "hi", "model": 5}', 400, "model"),
    (b'{"prompt": "hi", "model": "gpt-4"}', 404, "model"),
]


async def post(session, url, data: bytes, path="/v1/completions"):
    async with session.post(url + path, data=data,
                            headers={"Content-Type": "application/json"}) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


def check_error(status: int, ctype: str, raw: bytes, want_status: int, want_param) -> dict:
    assert status == want_status, raw
    assert ctype.startswith("application/json")
    error = __import__("json").loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == want_param, error
    return error


async def test_every_bad_body_is_a_4xx_and_the_engine_is_untouched(tokenizer):
    engine = scripted_engine(tokenizer, [300, 301, 302])
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        runner = engine.runner
        for body, want_status, want_param in BAD_BODIES:
            for stream in (False, True):
                data = body
                if stream and body.startswith(b'{"prompt"') and b"stream" not in body:
                    data = body[:-1] + b', "stream": true}'
                check_error(*await post(s, url, data), want_status, want_param)
        assert runner.steps == 0 and runner.prefilled_ids == []  # never touched
        status, _, raw = await post(s, url, __import__("json").dumps(OK).encode())
        assert status == 200 and b'"finish_reason": "length"' in raw
        assert engine.is_running and idle(engine)


async def test_bug24_body_size_limit_is_a_json_413_or_accepted_when_raised(tokenizer):
    big = b'{"prompt": "' + b"a" * (2 * 1024**2) + b'"}'
    async with serve(scripted_engine(tokenizer, [300])) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        error = check_error(*await post(s, url, big), 413, None)
        assert "limit" in error["message"]
        check_error(*await post(s, url, big, "/v1/chat/completions"), 413, None)
        status, _, _ = await post(s, url, b'{"prompt": "hi"}')
        assert status == 200
    config = ServerConfig(max_body_bytes=4 * 1024**2)
    async with serve(scripted_engine(tokenizer, [300]), config) as server, \
            aiohttp.ClientSession() as s:
        # accepted and parsed; the prompt is then too long for the 512-token context
        check_error(*await post(s, base_url(server), big), 400, "max_tokens")


async def test_bug24_unknown_paths_and_methods_answer_json(tokenizer):
    async with serve(scripted_engine(tokenizer, [300])) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        async with s.get(url + "/v1/nothing") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
        async with s.get(url + "/v1/completions") as r:
            assert r.status == 405 and "error" in await r.json()


async def test_bug24_websocket_bad_frames_get_error_messages_and_the_socket_lives(tokenizer):
    engine = scripted_engine(tokenizer, [300, 301])
    async with serve(engine) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(base_url(server) + "/ws") as ws:
        bad = ["not json", "[1]", '{"id": ' + "9" * 5000 + "}", '{"type": "generate"}',
               '{"type": "nope", "id": "x"}',
               '{"type": "generate", "id": "x", "prompt": ""}',
               '{"type": "generate", "id": "x", "prompt": "hi", "max_tokens": 0}',
               '{"type": "generate", "id": "x", "prompt": "hi", "top_p": 2}']
        for frame in bad:
            await ws.send_str(frame)
            reply = await ws.receive_json(timeout=30)
            assert reply["type"] == "error" and reply["message"]
        await ws.send_bytes(b"\x00\x01")
        assert (await ws.receive_json(timeout=30))["type"] == "error"
        assert engine.runner.steps == 0
        await ws.send_json({"type": "generate", "id": "ok", "prompt": "hi", "max_tokens": 2})
        kinds = [(await ws.receive_json(timeout=30))["type"] for _ in range(3)]
        assert kinds == ["token", "token", "done"]


async def test_bug12_empty_prompts_fail_alone_while_a_request_runs(tokenizer):
    engine = scripted_engine(tokenizer, [300] * 50, max_num_seqs=4)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        normal = asyncio.create_task(
            s.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 40}))
        await wait_until(lambda: engine.stats()["num_running"] == 1)
        with pytest.raises(ValueError, match="prompt is empty"):
            async for _ in engine.generate("", SamplingParams(max_tokens=2)):
                pass
        for path, body in [("/v1/completions", {"prompt": ""}),
                           ("/v1/completions", {"prompt": [""]}),
                           ("/v1/chat/completions", {"messages": []})]:
            async with s.post(url + path, json=body) as r:
                error = (await r.json())["error"]
                assert r.status == 400 and "empty" in error["message"]
        async with s.get(url + "/health") as r:
            assert r.status == 200
        response = await normal
        data = await response.json()
        assert data["usage"]["completion_tokens"] == 40
        # the test tokenizer adds a BOS: one token id is a valid prompt
        async with s.post(url + "/v1/completions", json={"prompt": [1], "max_tokens": 2}) as r:
            assert r.status == 200


async def test_bug13_max_tokens_one_and_out_of_range(tokenizer):
    async with serve(scripted_engine(tokenizer, [300, 301])) as server, \
            aiohttp.ClientSession() as s:
        url = base_url(server)
        for value in (0, -1, 10**9):
            for stream in (False, True):
                body = {"prompt": "hi", "max_tokens": value, "stream": stream}
                async with s.post(url + "/v1/completions", json=body) as r:
                    assert r.status == 400
                    assert (await r.json())["error"]["param"] == "max_tokens"
        async with s.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}) as r:
            data = await r.json()
        assert data["usage"]["completion_tokens"] == 1
        assert data["choices"][0]["finish_reason"] == "length"
        body = {"prompt": "hi", "max_tokens": 1, "stream": True}
        async with s.post(url + "/v1/completions", json=body) as r:
            events = await sse_events(r)
        assert len(events) == 3 and events[-1] == "[DONE]"
        content, finish = events[0]["choices"][0], events[1]["choices"][0]
        assert content["text"] and content["finish_reason"] is None
        assert finish["text"] == "" and finish["finish_reason"] == "length"


async def test_bug14_extreme_sampling_values_next_to_a_normal_request(model_dir):
    engine = AsyncEngine(EngineConfig(model=model_dir, num_kv_blocks=64))
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        prompt = "Once upon a time"

        async def text(**params) -> tuple[int, dict]:
            body = {"prompt": prompt, "max_tokens": 12, **params}
            async with s.post(url + "/v1/completions", json=body) as r:
                return r.status, await r.json()

        greedy = (await text(temperature=0))[1]["choices"][0]["text"]
        cases = [dict(temperature=1e-5), dict(temperature=0), dict(temperature=1.0, top_p=1e-9),
                 dict(temperature=0, top_p=1.0), dict(top_p=0), dict(top_p=1.5),
                 dict(temperature=-1)]
        normal = text(temperature=0, max_tokens=12)
        results = await asyncio.gather(normal, *(text(**c) for c in cases))
        assert results[0] == (200, results[0][1])
        assert results[0][1]["choices"][0]["text"] == greedy  # the batch-mate is unharmed
        for case, (status, data) in zip(cases, results[1:]):
            if case in (dict(top_p=0), dict(top_p=1.5), dict(temperature=-1)):
                assert status == 400 and data["error"]["param"] in case
            else:
                assert status == 200 and data["choices"][0]["text"] == greedy, case
        for bad in (float("nan"), float("inf")):
            with pytest.raises(ValueError, match="temperature"):
                SamplingParams(temperature=bad)
        assert idle(engine)
