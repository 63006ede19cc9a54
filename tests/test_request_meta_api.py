"""What a scheduling policy may know of a request, over the API (issue 27, item 1):
``priority``, ``user`` (the tenant), the ``X-Tenant`` header, ``ttft_slo_ms``,
``tpot_slo_ms``, ``deadline`` and ``metadata`` reach the engine's request through both
HTTP routes, the websocket and the real ``openai`` client; bad values are a 400 (an
error message on the websocket) naming the field; a shed request is a 503
``request_shed``."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import openai
import pytest
from scripted_runner import ScriptedRunner
from server_support import (
    CHAT_TEMPLATE,
    GatedRunner,
    base_url,
    idle,
    serve,
    sse_events,
    wait_until,
)

from aioserve import AsyncEngine, EngineConfig, RequestShedError
from aioserve.request_meta import RequestMeta
from aioserve.server import ServerConfig
from schedulers.fcfs import FCFSScheduler

META = {"priority": 3, "user": "alice", "ttft_slo_ms": 250, "tpot_slo_ms": 40.5,
        "metadata": {"team": "search", "trace": ""}}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 2}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GENERATE = {"type": "generate", "prompt": "Once upon a time", "max_tokens": 2}


class Recorder(FCFSScheduler):
    """FCFS that records, per request id, the metadata and deadline a policy sees."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, tuple[RequestMeta, float | None, float]] = {}

    def on_arrival(self, request, state) -> None:
        self.seen[request.request_id] = (request.meta, request.deadline, request.arrival_time)

    def only(self, prefix: str) -> tuple[RequestMeta, float | None, float]:
        (entry,) = [v for k, v in self.seen.items() if k.startswith(prefix)]
        return entry


@pytest.fixture
async def server(tokenizer):
    recorder = Recorder()
    engine = AsyncEngine(EngineConfig(model="scripted"), runner=ScriptedRunner([300, 301, 302]),
                         tokenizer=tokenizer, scheduler=recorder)
    config = ServerConfig(chat_template=CHAT_TEMPLATE, served_model_name="m")
    async with serve(engine, config) as srv, aiohttp.ClientSession() as session:
        yield base_url(srv), session, engine, recorder


def expected(tenant: str | None = "alice") -> RequestMeta:
    return RequestMeta(priority=3, tenant=tenant, ttft_slo_ms=250, tpot_slo_ms=40.5,
                       metadata={"team": "search", "trace": ""})


def without_deadline(meta: RequestMeta) -> RequestMeta:
    return RequestMeta(meta.priority, meta.tenant, meta.ttft_slo_ms, meta.tpot_slo_ms,
                       None, meta.metadata)


async def test_the_fields_reach_the_engine_over_both_routes_and_the_websocket(server):
    url, s, engine, recorder = server
    deadline = time.time() + 3600
    async with s.post(url + "/v1/completions", json={**COMPLETION, **META, "request_id": "c",
                                                     "deadline": deadline}) as r:
        assert r.status == 200, await r.text()
    meta, on_clock, arrival = recorder.only("cmpl-c-")
    assert without_deadline(meta) == expected() and meta.deadline == deadline
    assert 0 < on_clock - arrival <= 3600  # the deadline on the engine's clock
    async with s.post(url + "/v1/chat/completions", json={**CHAT, **META, "request_id": "h"},
                      headers={"X-Tenant": "gateway-7"}) as r:
        assert r.status == 200, await r.text()
    assert recorder.only("chatcmpl-h-")[0] == expected("gateway-7")  # the header wins
    async with s.ws_connect(url + "/ws") as ws:
        await ws.send_json({**GENERATE, **META, "id": "w1"})
        while (await ws.receive_json(timeout=30))["type"] != "done":
            pass
    assert recorder.only("ws")[0] == expected()
    async with s.ws_connect(url + "/ws", headers={"X-Tenant": "gateway-8"}) as ws:
        for rid in ("w2", "w3"):  # the upgrade's header applies to every message
            await ws.send_json({**GENERATE, **META, "id": rid})
            while (await ws.receive_json(timeout=30))["type"] != "done":
                pass
    tenants = [meta.tenant for rid, (meta, _, _) in recorder.seen.items()
               if rid.endswith(("-w2-0", "-w3-0"))]
    assert tenants == ["gateway-8", "gateway-8"]
    await wait_until(lambda: idle(engine))


async def test_absent_null_and_empty_fields_mean_the_defaults(server):
    url, s, _, recorder = server
    nulls = {name: None for name in (*META, "deadline")}
    for rid, extra in (("a", {}), ("b", nulls), ("c", {"user": ""})):
        async with s.post(url + "/v1/completions",
                          json={**COMPLETION, **extra, "request_id": rid}) as r:
            assert r.status == 200, await r.text()
        meta, deadline, _ = recorder.only(f"cmpl-{rid}-")
        assert meta == RequestMeta() and deadline is None


async def test_the_openai_client_sends_user_metadata_priority_and_the_header(server):
    url, _, _, recorder = server
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    await client.chat.completions.create(
        model="m", messages=CHAT["messages"], max_tokens=2, user="carol",
        metadata={"app": "notes"}, extra_body={"priority": 1, "request_id": "o1"})
    meta = recorder.only("chatcmpl-o1-")[0]
    assert (meta.priority, meta.tenant, dict(meta.metadata)) == (1, "carol", {"app": "notes"})
    await client.completions.create(
        model="m", prompt="Once", max_tokens=2, user="dave",
        extra_headers={"X-Tenant": "gw"},
        extra_body={"priority": -2, "ttft_slo_ms": 100, "request_id": "o2"})
    meta = recorder.only("cmpl-o2-")[0]
    assert (meta.priority, meta.tenant, meta.ttft_slo_ms) == (-2, "gw", 100)


#: (field, bad values): each is a 400 naming the field.
BAD = {
    "priority": [1.5, "1", True, 2**63, [1]],
    "user": [5, "x" * 257, {"id": "a"}],
    "ttft_slo_ms": [0, -1, "5", False, 10**400],
    "tpot_slo_ms": [0, -0.5, [], "fast"],
    "deadline": [0, -5, "tomorrow", True],
    "metadata": [[], "x", {"a": 1}, {"": "v"}, {"k" * 65: "v"}, {"k": "v" * 513},
                 {str(i): "v" for i in range(17)}],
    "length_hint": [-1, 1.5, "10", 512, 2**70],  # the context is 512 tokens
}
CASES = [(field, value) for field, values in BAD.items() for value in values]


async def test_every_bad_value_is_a_400_naming_its_field(server):
    url, s, engine, _ = server
    for field, value in CASES:
        for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
            async with s.post(url + path, json={**body, field: value}) as r:
                error = (await r.json())["error"]
                assert (r.status, error["param"]) == (400, field), (path, field, value, error)
                assert error["message"].startswith(field), error
    for value in ("x" * 257, "two words", "caf\u00e9"):
        async with s.post(url + "/v1/completions", json=COMPLETION,
                          headers={"X-Tenant": value}) as r:
            error = (await r.json())["error"]
            assert (r.status, error["param"]) == (400, "X-Tenant"), error
    assert engine.runner.steps == 0  # never touched


async def test_every_bad_value_on_the_websocket_is_an_error_naming_its_field(server):
    url, s, engine, _ = server
    async with s.ws_connect(url + "/ws") as ws:
        for index, (field, value) in enumerate(CASES):
            await ws.send_json({**GENERATE, "id": f"b{index}", field: value})
            error = await ws.receive_json(timeout=30)
            assert (error["type"], error["id"], error["param"]) == ("error", f"b{index}", field)
    async with s.ws_connect(url + "/ws", headers={"X-Tenant": "x" * 257}) as ws:
        await ws.send_json({**GENERATE, "id": "t"})
        error = await ws.receive_json(timeout=30)
        assert (error["type"], error["param"]) == ("error", "X-Tenant")
    assert engine.runner.steps == 0


async def test_a_shed_request_is_a_503_request_shed_on_every_transport(tokenizer):
    runner = GatedRunner([300] * 10, num_kv_blocks=64)
    engine = AsyncEngine(EngineConfig(model="scripted"), runner=runner, tokenizer=tokenizer)

    async def shed_at_the_gate() -> None:
        """Shed every request while its step is held (as a policy would drop a running
        request; the engine's own shedding comes with the scheduler contract v2)."""
        await wait_until(lambda: runner.at_gate)
        for rid, stream in list(engine._delivery.streams.items()):
            stream.push_error(RequestShedError("the policy sheds this request"))
            engine.abort(rid)
        runner.gate.set()

    async with serve(engine) as srv, aiohttp.ClientSession() as s:
        url = base_url(srv)
        for stream in (False, True):
            runner.gate.clear()
            shedding = asyncio.create_task(shed_at_the_gate())
            async with s.post(url + "/v1/completions", json={**COMPLETION, "stream": stream}
                              ) as r:
                body = await r.json() if not stream else await sse_events(r)
            await shedding
            if stream:
                assert r.status == 200 and "[DONE]" not in body
                body = body[-1]
            else:
                assert r.status == 503
            assert body["error"]["code"] == "request_shed", body
        async with s.ws_connect(url + "/ws") as ws:
            runner.gate.clear()
            shedding = asyncio.create_task(shed_at_the_gate())
            await ws.send_json({**GENERATE, "id": "s"})
            error = await ws.receive_json(timeout=30)
            await shedding
        assert (error["type"], error["id"], error["code"]) == ("error", "s", "request_shed")
        await wait_until(lambda: idle(engine))
        async with s.post(url + "/v1/completions", json=COMPLETION) as r:
            assert r.status == 200 and json.loads(await r.text())["choices"]
