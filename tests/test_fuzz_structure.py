"""Structural fuzzing of every request body (issue 26, item 5): not only values but the
structure of each field — depth (nesting to 900 levels), width (thousands of items),
size, kinds mixed at every level, magnitudes no float holds — sent to a real engine
behind a real server on 127.0.0.1, over both HTTP routes and the websocket.

Every body that parses as JSON gets a 200 whose body matches its response model, or a
4xx whose error names a field of the body in the API's own words (never pydantic's);
nothing ends in a 500, an SSE error event or a failed model step; afterwards the engine
is idle and serves."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from server_support import ServerThread, idle

from aioserve import AsyncEngine, EngineConfig
from aioserve.server.schema import ChatCompletionRequest, CompletionRequest, WsGenerate
from aioserve.server.schema import responses as out

FIELDS = sorted(set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
                | set(WsGenerate.model_fields) | {"unknown", "best_of", "n"})
#: Fields an error may name though the body lacks them: a required field, the rule that
#: counts prompts times ``n``, the engine's context check on the output limit.
IMPLIED = {"/v1/completions": {"prompt", "n", "max_tokens"},
           "/v1/chat/completions": {"messages", "max_tokens"},
           "/ws": {"type", "id", "prompt", "max_tokens"}}

EDGE_INTS = [0, 1, -1, 2, 20, 21, 256, 257, 511, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64,
             -(2**63) - 1, 10**30, 10**400]
EDGE_FLOATS = [0.0, -0.0, 0.5, 2.0, -1.5, 5e-324, 1e-45, 1e19, 3.4e38, 3.5e38, 1e308,
               math.nan, math.inf, -math.inf]
EDGE_TEXT = ["", " ", "hi", "Once upon a time", "\ud800", "{param}", "\x00", "x" * 5000,
             "text", "user", "assistant", "generate"]

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(EDGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(EDGE_FLOATS),
    st.text(max_size=10), st.sampled_from(EDGE_TEXT),
)
keys = st.text(max_size=6) | st.sampled_from(FIELDS + ["text", "type", "role", "content"])


class Deep:
    """A value nested ``depth`` times in lists or one-key objects (encoded by hand: the
    client's own encoder would overflow its stack first)."""

    def __init__(self, depth: int, leaf: Any, kind: str) -> None:
        self.depth, self.leaf, self.kind = depth, leaf, kind

    def encode(self) -> str:
        left, right = ("[", "]") if self.kind == "list" else ('{"text": ', "}")
        return left * self.depth + encode(self.leaf) + right * self.depth


def encode(value: Any) -> str:
    """JSON text (``NaN``/``Infinity`` literals included, as Python's reader takes them)."""
    if isinstance(value, Deep):
        return value.encode()
    if isinstance(value, list):
        return "[" + ", ".join(encode(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {encode(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


shapes = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=16,
)
deep = st.builds(Deep, st.integers(2, 900), shapes, st.sampled_from(["list", "object"]))
wide = st.builds(lambda leaf, n, as_list: [leaf] * n if as_list else {str(i): leaf
                                                                       for i in range(n)},
                 leaves, st.integers(17, 3000), st.booleans())
values = st.one_of(leaves, leaves, shapes, deep, wide)  # scalars often: they reach the engine

BASES = {
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 3},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 3},
    "/ws": {"type": "generate", "id": "f", "prompt": "Once upon a time", "max_tokens": 3},
}


def bodies(path: str) -> st.SearchStrategy[dict[str, Any]]:
    """The path's valid body with 1 to 3 fields replaced or added, or none of it."""
    changes = st.dictionaries(st.sampled_from(FIELDS), values, min_size=1, max_size=3)
    keep = st.booleans().map(lambda k: dict(BASES[path]) if k else {})
    return st.builds(lambda base, new: {**base, **new}, keep, changes)


@pytest.fixture(scope="module")
def server(model_dir) -> Iterator[ServerThread]:
    engine = AsyncEngine(EngineConfig(model=model_dir, max_model_len=64, max_num_seqs=16))
    srv = ServerThread(engine).start()
    yield srv
    srv.close()


def check_error(error: dict[str, Any], body: dict[str, Any], path: str) -> str:
    """An error naming a field of the body (or one a rule implies) in ``param`` and in its
    message; only a body the JSON reader cannot take, or a non-text field
    name, names none."""
    assert set(error) >= {"message", "param", "code"}, error
    message = error["message"]
    if error["param"] is not None and error["code"] == "invalid_value":
        assert error["param"] in message, error
    if error["param"] is None:
        assert error["code"] in ("invalid_json", "invalid_encoding"), error
    else:
        assert error["param"] in set(body) | IMPLIED[path], error
    return f"{error['code']} {error['param']}"


RESPONSES = {"/v1/completions": (out.Completion, out.CompletionChunk),
             "/v1/chat/completions": (out.ChatCompletion, out.ChatCompletionChunk)}


async def post(url: str, path: str, body: dict[str, Any]) -> str:
    """Send ``body``, check the answer; what it was (a hypothesis event)."""
    raw = encode(body).encode()
    async with aiohttp.ClientSession() as s, s.post(
        url + path, data=raw, headers={"Content-Type": "application/json"}
    ) as r:
        text = await r.text()
    assert r.status in (200, 400, 404, 413), text
    if r.status != 200:
        return f"{r.status} " + check_error(json.loads(text)["error"], body, path)
    whole, chunk = RESPONSES[path]
    if not r.headers["Content-Type"].startswith("text/event-stream"):
        whole.model_validate_json(text)
        return "200"
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", text[-500:]
    for data in events[:-1]:
        chunk.model_validate_json(data)
    return "200 stream"


#: One value of every structure and magnitude class: each is sent in every field of
#: every route, on top of a valid body, so that each field's reader meets them all.
PROBES: dict[str, Any] = {
    "null": None, "true": True, "2.0": 2.0, "10**400": 10**400, "-10**400": -(10**400),
    "2**64": 2**64, "3.5e38": 3.5e38, "1e308": 1e308, "5e-324": 5e-324, "nan": math.nan,
    "-inf": -math.inf, "empty text": "", "long text": "x" * 20_000, "surrogate": "\ud800",
    "braces": "{message} {param}", "[]": [], "{}": {},
    "mixed list": [1, "a", None, True, 2.5, [], {}], "wide list": list(range(2000)),
    "wide object": {str(i): "v" for i in range(2000)}, "deep list": Deep(900, 1, "list"),
    "deep object": Deep(900, "x", "object"),
    "object holding deep": {"include_usage": Deep(500, True, "list"), "a": Deep(500, 1, "list")},
    "parts holding deep": [{"role": "user", "content": [{"type": "text",
                                                         "text": Deep(500, "x", "list")}]}],
    "list of huge": [10**400, 1e308, math.nan], "ids of huge": [[10**30]],
}


def probes(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(description, body) for every field and probe, on the path's valid body."""
    for field in FIELDS:
        for name, value in PROBES.items():
            yield f"{field}={name}", {**BASES[path], field: value}


async def gather_failures(checks: list[tuple[str, Any]]) -> list[str]:
    """Run the checks 8 at a time (so the engine batches them); the failed ones."""
    gate = asyncio.Semaphore(8)

    async def one(what: str, check: Any) -> str | None:
        async with gate:
            try:
                await check
            except AssertionError as exc:
                return f"{what}: {str(exc)[:300]}"
            return None

    results = await asyncio.gather(*(one(what, check) for what, check in checks))
    return [r for r in results if r is not None]


async def probe_http(url: str) -> list[str]:
    return await gather_failures([(f"{path} {what}", post(url, path, body))
                                  for path in sorted(RESPONSES) for what, body in probes(path)])


async def probe_websocket(url: str) -> list[str]:
    return await gather_failures([(f"/ws {what}", generate(url, message))
                                  for what, message in probes("/ws")])


def test_every_field_of_both_routes_takes_every_structure(server):
    failures = server.run(probe_http(server.url))
    assert not failures, "\n".join(failures)


def test_every_field_of_a_websocket_message_takes_every_structure(server):
    failures = server.run(probe_websocket(server.url))
    assert not failures, "\n".join(failures)


FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(data=st.data())
def test_http_bodies_of_any_structure_get_a_200_or_a_4xx_naming_the_field(server, data):
    path = data.draw(st.sampled_from(sorted(RESPONSES)))
    event(server.run(post(server.url, path, data.draw(bodies(path)))))


async def generate(url: str, message: dict[str, Any]) -> str:
    """Send ``message`` on a new socket, check the answer; what it was."""
    raw = encode(message)  # ASCII: json.dumps escapes the rest
    async with aiohttp.ClientSession() as s, s.ws_connect(url + "/ws") as ws:
        await ws.send_str(raw)
        while True:
            reply = await ws.receive_json(timeout=60)
            if reply["type"] == "error":
                assert reply["code"] not in ("engine_error", "engine_not_running"), reply
                return "error " + check_error(reply, message, "/ws")
            if reply["type"] == "done":
                assert reply["finish_reason"] in ("stop", "length"), reply
                return "done"
            assert reply["type"] == "token", reply


@FUZZ
@given(message=bodies("/ws"))
def test_websocket_messages_of_any_structure_get_tokens_or_an_error_naming_the_field(
        server, message):
    event(server.run(generate(server.url, message)))


def test_after_fuzzing_the_engine_is_idle_and_serves(server):
    async def check() -> None:
        await post(server.url, "/v1/completions", {"prompt": "Once", "max_tokens": 2})
        assert idle(server.engine) and server.engine.is_running

    server.run(check())
