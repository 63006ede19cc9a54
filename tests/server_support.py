"""Helpers for the server tests: a real aiohttp server on 127.0.0.1, SSE parsing, and
bounded polling of engine state."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from scripted_runner import ScriptedRunner

from aioserve import AsyncEngine, EngineConfig
from aioserve.server import ServerConfig, create_app

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@contextlib.asynccontextmanager
async def serve(
    engine: AsyncEngine, config: ServerConfig | None = None, **server_kw: Any
) -> AsyncIterator[TestServer]:
    """Run ``engine`` behind the app on 127.0.0.1 (random port); yields the server."""
    server = TestServer(create_app(engine, config), host="127.0.0.1", port=0, **server_kw)
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


def scripted_engine(
    tokenizer: Any, script: Any, *, max_num_seqs: int = 32, **runner_kw: Any
) -> AsyncEngine:
    """An engine on a ScriptedRunner with the real tokenizer (exact text)."""
    runner = ScriptedRunner(script, **runner_kw)
    config = EngineConfig(model="scripted", max_num_seqs=max_num_seqs)
    return AsyncEngine(config, runner=runner, tokenizer=tokenizer)


def base_url(server: TestServer) -> str:
    """``http://127.0.0.1:PORT``."""
    return str(server.make_url("")).rstrip("/")


async def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``condition`` (every ms) until it holds; AssertionError after ``timeout`` s
    (a bound against hangs, far above any wait on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


def idle(engine: AsyncEngine) -> bool:
    """No request running or waiting, and every KV block free."""
    stats = engine.stats()
    return stats["num_running"] == 0 and stats["num_waiting"] == 0 and (
        stats["kv_cache_usage"] == 0
    )


async def sse_events(response: aiohttp.ClientResponse) -> list[Any]:
    """All ``data:`` payloads of an SSE response, JSON-decoded (``"[DONE]"`` kept as is)."""
    events: list[Any] = []
    async for raw in response.content:
        line = raw.decode("utf-8").strip()
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


class GatedRunner(ScriptedRunner):
    """A scripted runner whose steps wait while ``gate`` is closed, so a test can hold
    the engine still (``at_gate`` is True while a step waits) with requests running.
    Each step takes ``delay`` seconds (simulated compute, so load builds up)."""

    def __init__(self, *args: Any, delay: float = 0.002, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.delay = delay
        self.gate = asyncio.Event()
        self.gate.set()
        self.at_gate = False

    async def step(self, batch: Any) -> Any:
        if not self.gate.is_set():
            self.at_gate = True
            await self.gate.wait()
            self.at_gate = False
        await asyncio.sleep(self.delay)
        return await super().step(batch)


class ServerThread:
    """``engine`` behind the app, served from its own event loop in a thread, for tests
    that drive it from blocking code (hypothesis, schemathesis): ``start`` waits until
    it listens, ``run`` runs a coroutine on its loop, ``call`` a blocking function
    there (in a worker thread), ``close`` stops it."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.url = ""
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self.main(),))

    async def main(self) -> None:
        self.stop = asyncio.Event()
        config = ServerConfig(chat_template=CHAT_TEMPLATE, served_model_name="m")
        async with serve(self.engine, config) as server:
            self.url = f"http://127.0.0.1:{server.port}"
            self.ready.set()
            await self.stop.wait()

    def start(self, timeout: float = 120.0) -> ServerThread:
        self.thread.start()
        assert self.ready.wait(timeout), "the server did not start"
        return self

    def run(self, coroutine: Any, timeout: float = 900.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        return self.run(asyncio.to_thread(fn))

    def close(self) -> None:
        assert self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)
