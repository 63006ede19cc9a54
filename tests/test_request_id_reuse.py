"""Issue 26, item 2: an id reused right after its request ended (a websocket cancel, an
HTTP client that left, ``AsyncEngine.abort``) gets its own complete answer or a clear
error, never silence; nothing late of the old request touches the new one. Real
servers on 127.0.0.1, the real test model."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_runner import ScriptedRunner
from server_support import base_url, idle, scripted_engine, serve, wait_until

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.runners.base import RunnerOutput, ScheduledBatch

PROMPT = [1, 403, 407, 261, 378]  # "Once upon a time"


def generate(client_id: str, max_tokens: int, prompt: list[int] = PROMPT) -> dict:
    return {"type": "generate", "id": client_id, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


async def test_a_websocket_id_reused_right_after_its_cancel_gets_its_whole_answer(
    model_dir, solo_greedy
):
    """The issue's sequence, ten times on one socket: generate Y, first token, cancel Y,
    at once generate Y again. Before the fix the second Y got nothing, ever."""
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=4))
    async with serve(engine) as server, aiohttp.ClientSession() as http, \
            http.ws_connect(base_url(server) + "/ws") as ws:
        for attempt in range(10):
            prompt = [1, 300 + attempt, 301]
            await ws.send_json(generate("Y", 50))
            assert (await ws.receive_json(timeout=60))["type"] == "token"
            await ws.send_json({"type": "cancel", "id": "Y"})
            await ws.send_json(generate("Y", 8, prompt))
            message = await ws.receive_json(timeout=60)
            while message["type"] == "token":  # the first Y's tokens already on their way
                message = await ws.receive_json(timeout=60)
            assert (message["type"], message["finish_reason"]) == ("done", "abort")
            tokens: list[int] = []
            message = await ws.receive_json(timeout=60)
            while message["type"] == "token":
                assert message["id"] == "Y"
                tokens += message["token_ids"]
                message = await ws.receive_json(timeout=60)
            assert (message["type"], message["finish_reason"]) == ("done", "length"), message
            assert tokens == solo_greedy(prompt, 8)
            assert message["usage"]["completion_tokens"] == 8
        await wait_until(lambda: idle(engine))
        assert not engine._delivery.streams


async def test_an_http_request_id_reused_right_after_a_disconnect_works_or_is_a_400(
    model_dir,
):
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=4))
    async with serve(engine) as server, aiohttp.ClientSession() as http:
        url = base_url(server) + "/v1/completions"
        body = {"model": model_dir, "prompt": PROMPT, "temperature": 0, "ignore_eos": True}
        outcomes = []
        for _ in range(5):
            first = await http.post(url, json={**body, "max_tokens": 200, "stream": True,
                                               "request_id": "R"})
            await first.content.readline()
            first.close()  # the client leaves; at once the id comes again
            while True:  # a 400 while the server has not seen the disconnect yet
                async with http.post(url, json={**body, "max_tokens": 6},
                                     headers={"X-Request-Id": "R"}) as again:
                    reply = await again.json()
                outcomes.append(again.status)
                if again.status == 200:
                    break
                assert again.status == 400, reply
                assert (reply["error"]["code"], reply["error"]["param"]) == (
                    "duplicate_request_id", "request_id")
            assert reply["usage"]["completion_tokens"] == 6
            assert reply["choices"][0]["finish_reason"] == "length"
        await wait_until(lambda: idle(engine))
        assert outcomes.count(200) == 5


async def test_engine_request_id_is_free_again_right_after_abort():
    """The Python API: after ``abort(id)`` the id may be reused at once, and the old
    stream's consumer, ending later, leaves the new request alone."""
    engine = scripted_engine(None, [5, 6, 7, 8, 9, 10, 11, 12])
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    async with engine:
        old = engine.generate([1, 2, 3], params, request_id="X")
        assert (await old.__anext__()).token_ids == [5]
        engine.abort("X")
        new = engine.generate([1, 2, 3], params, request_id="X")
        first = await new.__anext__()
        assert first.request_id == "X" and first.token_ids == [5]
        rest = [out async for out in old]  # the old consumer reads its end, releases
        assert rest[-1].finish_reason == "abort"
        outputs = [first] + [out async for out in new]
        assert [t for out in outputs for t in out.token_ids] == [5, 6, 7, 8, 9, 10, 11, 12]
        assert outputs[-1].finish_reason == "length"
        await wait_until(lambda: idle(engine))
        assert not engine._delivery.streams


async def test_release_of_an_ended_stream_never_touches_a_request_that_took_its_id():
    engine = scripted_engine(None, [5, 6, 7])
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    async with engine:
        old = engine.add_request([1, 2], params, request_id="X")
        engine.abort("X")
        new = engine.add_request([1, 2], params, request_id="X")
        engine.release(old)
        engine.release(old)  # idempotent, and still by identity
        assert engine._delivery.streams["X"] is new and not new.request.is_finished
        outputs = []
        while not outputs or not outputs[-1].finished:
            outputs.append(await new.queue.get())
        assert [t for out in outputs for t in out.token_ids] == [5, 6, 7]
        engine.release(new)
        await wait_until(lambda: idle(engine))
        assert not engine._delivery.streams


class GatedRunner(ScriptedRunner):
    """A ScriptedRunner whose step ``fail_on_step`` waits for :attr:`gate` (telling
    :attr:`reached` that it started) and then fails."""

    def __init__(self, script: list[int], fail_on_step: int) -> None:
        super().__init__(script, fail_on_step=fail_on_step)
        self.reached = asyncio.Event()
        self.gate = asyncio.Event()

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        if self.steps == self.fail_on_step:
            self.reached.set()
            await self.gate.wait()
        return await super().step(batch)


async def test_a_failed_step_never_ends_a_request_that_took_an_aborted_ids_place():
    """Step 1 runs X and Y; while it runs, X is aborted and a new X takes the id; the
    step then fails: Y ends with the step's error, the new X is not touched (it was
    not in the step) and gets its whole answer."""
    runner = GatedRunner([5, 6, 7], fail_on_step=1)
    engine = AsyncEngine(EngineConfig(model="scripted"), runner=runner, tokenizer=None)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    async with engine:
        old = engine.add_request([1, 2], params, request_id="X")
        mate = engine.add_request([1, 2], params, request_id="Y")
        await asyncio.wait_for(runner.reached.wait(), 60)
        engine.abort("X")
        new = engine.add_request([1, 2], params, request_id="X")
        runner.gate.set()
        mate_items = [await mate.queue.get()]
        while not isinstance(mate_items[-1], BaseException):
            mate_items.append(await mate.queue.get())
        assert "model step failed" in str(mate_items[-1])
        outputs = []
        while not outputs or not outputs[-1].finished:
            item = await new.queue.get()
            assert not isinstance(item, BaseException), item
            outputs.append(item)
        assert [t for out in outputs for t in out.token_ids] == [5, 6, 7]
        assert outputs[-1].finish_reason == "length"
        for stream in (old, mate, new):
            engine.release(stream)
        await wait_until(lambda: idle(engine))
        assert not engine._delivery.streams


async def test_an_id_is_refused_while_its_request_runs():
    engine = scripted_engine(None, [5])
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    async with engine:
        first = engine.add_request([1, 2], params, request_id="X")
        try:
            engine.add_request([1, 2], params, request_id="X")
        except ValueError as exc:
            assert "request_id 'X' is already in use" in str(exc)
        else:
            raise AssertionError("a running request's id was taken")
        engine.release(first)
        await asyncio.wait_for(wait_until(lambda: idle(engine)), 60)


IDS = st.sampled_from(["a", "b", "c"])
#: generate, cancel, reuse (while the id runs, wait for a message of it, then a cancel
#: and at once a generate with the same id: the issue's sequence), receive up to n
#: messages (while some generate is open).
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("generate"), IDS, st.integers(1, 40), st.integers(0, 2)),
        st.tuples(st.just("cancel"), IDS),
        st.tuples(st.just("reuse"), IDS, st.integers(1, 40), st.integers(0, 2)),
        st.tuples(st.just("receive"), st.integers(1, 4)),
    ),
    min_size=1, max_size=24,
)
PROMPTS = ([1, 403, 407, 261, 378], [1, 403, 407, 261, 378, 300, 301], [1] + list(range(40, 58)))


@pytest.fixture(scope="module")
def ws_server(model_dir) -> Iterator[tuple[asyncio.AbstractEventLoop, AsyncEngine, str]]:
    """One real server (test model, a KV cache of 4 blocks of 16 tokens, so requests
    queue and get preempted) on a loop of its own, shared by the examples."""
    loop = asyncio.new_event_loop()
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=4, num_kv_blocks=4))
    running = serve(engine)
    server = loop.run_until_complete(running.__aenter__())
    try:
        yield loop, engine, base_url(server) + "/ws"
    finally:
        loop.run_until_complete(running.__aexit__(None, None, None))
        loop.close()


async def drive(url: str, ops: list[tuple], drain: bool) -> None:
    """Run ``ops`` on one socket, checking each message as it comes: every generate
    ends exactly once (``done``, or an ``error`` other than a cancel's ``unknown_id``),
    and no token comes for an id whose generates have all ended. With ``drain``, wait
    for every end, then a cancel of an unused id must be answered with nothing but
    other cancels' answers before it (nothing trails); otherwise close the socket with
    generations open."""
    generates: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    log: list[dict] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:

        async def receive() -> dict:
            message = await ws.receive_json(timeout=60)
            log.append(message)
            kind, client_id = message["type"], message["id"]
            if kind == "token":
                assert ends[client_id] < generates[client_id], log
            elif kind == "done" or message.get("code") != "unknown_id":
                assert kind in ("done", "error"), log
                ends[client_id] += 1
                assert ends[client_id] <= generates[client_id], log
            return message

        def open_count() -> int:
            return sum(generates.values()) - sum(ends.values())

        for op in ops:
            if op[0] in ("generate", "reuse"):
                _, client_id, max_tokens, prompt = op
                if op[0] == "reuse":
                    while ends[client_id] < generates[client_id]:
                        if (await receive())["id"] == client_id:
                            break
                    await ws.send_json({"type": "cancel", "id": client_id})
                generates[client_id] += 1
                await ws.send_json(generate(client_id, max_tokens, PROMPTS[prompt]))
            elif op[0] == "cancel":
                await ws.send_json({"type": "cancel", "id": op[1]})
            else:
                for _ in range(op[1]):
                    if open_count():
                        await receive()
        if drain:
            while open_count():
                await receive()
            assert ends == generates, log
            await ws.send_json({"type": "cancel", "id": "unused"})
            message = await receive()
            while message["id"] != "unused":  # only earlier cancels' answers may come first
                assert message.get("code") == "unknown_id", log
                message = await receive()


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=OPS, drain=st.booleans())
def test_any_generate_cancel_reuse_close_sequence_ends_each_generate_once(ws_server, ops, drain):
    loop, engine, url = ws_server
    loop.run_until_complete(drive(url, ops, drain))
    loop.run_until_complete(wait_until(lambda: idle(engine)))
    blocks = engine.core.blocks
    assert blocks.num_free_blocks == blocks.num_blocks
    assert not engine.core.requests and not engine._delivery.streams
