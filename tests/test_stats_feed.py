"""Issue 13: the engine's listener hook and the ``/ws/stats`` dashboard feed, on a real
server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from scripted_runner import ScriptedRunner
from server_support import GatedRunner, base_url, idle, serve, wait_until

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.server import ServerConfig
from aioserve.server.ws.stats_feed import STATS_FEED_KEY, StatsFeed
from aioserve.sim.runner import SimulatedRunner

LOAD = {"model": "scripted", "prompt": "Once upon a time", "max_tokens": 400,
        "ignore_eos": True}


class Recorder:
    """An engine listener that keeps what it is given."""

    def __init__(self) -> None:
        self.snapshots = []
        self.finished = []

    def on_step(self, snapshot) -> None:
        self.snapshots.append(snapshot)

    def on_finish(self, request) -> None:
        self.finished.append(request.request_id)


class Broken:
    def on_step(self, snapshot) -> None:
        raise RuntimeError("listener bug")

    def on_finish(self, request) -> None:
        raise RuntimeError("listener bug")


async def run_requests(engine: AsyncEngine, n: int, max_tokens: int) -> list[int]:
    async def one(i: int) -> int:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        outputs = [out async for out in engine.generate([1, 5 + i], params)]
        return outputs[-1].num_output_tokens

    return await asyncio.gather(*(one(i) for i in range(n)))


async def test_listener_sees_every_step_and_finish_and_a_broken_one_is_ignored():
    steps, finishes, broken = Recorder(), Recorder(), Broken()
    engine = AsyncEngine(EngineConfig(model="scripted", max_num_seqs=2),
                         runner=ScriptedRunner([7]))
    engine.add_listener(steps)
    engine.add_listener(finishes, step_interval=None)
    engine.add_listener(broken)
    async with engine:
        produced = await run_requests(engine, 5, 6)
        await wait_until(lambda: idle(engine))
    assert sorted(finishes.finished) == [f"req-{i}" for i in range(5)]
    assert steps.finished == finishes.finished and not finishes.snapshots
    numbers = [s.step for s in steps.snapshots]
    assert numbers == sorted(numbers)
    assert all(len(s.slots) == 2 and s.scheduler == "fcfs" for s in steps.snapshots)
    last = steps.snapshots[-1]
    assert last.slots == (None, None) and last.kv_used_blocks == 0 and last.num_waiting == 0
    assert last.num_generated_tokens == sum(produced)
    seen = {s.request_id for snap in steps.snapshots for s in snap.slots if s is not None}
    assert seen == set(finishes.finished)


async def test_step_interval_is_measured_on_the_engine_clock():
    recorder = Recorder()
    runner = SimulatedRunner(step_ms=50.0)
    engine = AsyncEngine(EngineConfig(model="sim", max_num_seqs=4), runner=runner)
    engine.add_listener(recorder, step_interval=0.1)
    async with engine:
        await run_requests(engine, 4, 20)
    *times, idle_time = [s.time for s in recorder.snapshots]  # idle: sent at once
    assert len(times) >= 5 and idle_time >= times[-1]
    assert all(b - a >= 0.1 - 1e-9 for a, b in zip(times, times[1:]))


async def test_ws_stats_frames_match_the_engine_at_a_quiescent_moment(tokenizer):
    """Frames are published after a step's update; the engine is held at a step whose
    schedule changed nothing (slots full, a KV cache too big to preempt, no request
    near its end), one step after all six requests are in. (Holding it at the first
    gate instead failed on a loaded machine: all six could arrive before any step ended,
    so no frame had them.)"""
    runner = GatedRunner([300, 301], num_kv_blocks=512)
    engine = AsyncEngine(EngineConfig(model="scripted", max_num_seqs=4), runner=runner,
                         tokenizer=tokenizer)
    async with serve(engine, ServerConfig(stats_interval=0.0)) as server, \
            aiohttp.ClientSession() as http:
        url = base_url(server)
        async with http.ws_connect(url + "/ws/stats") as ws:
            first = await ws.receive_json(timeout=60)
            assert first["type"] == "frame" and first["slots"] == [None] * 4
            assert first["scheduler"] == "fcfs" and first["model"] == "scripted"
            body = {**LOAD, "max_tokens": 500}  # none ends while the test holds the engine
            load = [asyncio.create_task(http.post(url + "/v1/completions", json=body))
                    for _ in range(6)]
            # all six in (4 running, 2 waiting): the next schedule admits nobody, so the
            # last frame before the gate shows what the engine holds at the gate
            await wait_until(lambda: (engine.stats()["num_running"],
                                      engine.stats()["num_waiting"]) == (4, 2), timeout=60)
            runner.gate.clear()
            await wait_until(lambda: runner.at_gate, timeout=60)
            steps = runner.steps  # one more step, scheduled with all six in: then hold
            runner.gate.set()
            runner.gate.clear()  # the step waiting is let through, the next one waits
            await wait_until(lambda: runner.steps > steps and runner.at_gate, timeout=60)
            now = engine.snapshot()
            frame = first
            while frame["step"] != now.step or frame["num_waiting"] != now.num_waiting:
                frame = await ws.receive_json(timeout=60)
            shown = [s and s[0] for s in frame["slots"]]
            assert shown == [s and s.request_id for s in now.slots]
            assert set(filter(None, shown)) == {r.request_id for r in engine.core.running}
            assert [w[0] for w in frame["waiting"]] == [r.request_id for r in engine.core.waiting]
            assert frame["kv_used_blocks"] == now.kv_used_blocks > 0
            for task in load:
                task.cancel()
            runner.gate.set()
            await asyncio.gather(*load, return_exceptions=True)
            await wait_until(lambda: idle(engine), timeout=60)


async def test_a_viewer_that_never_reads_loses_frames_not_engine_time(tokenizer):
    runner = ScriptedRunner([300, 301], num_kv_blocks=64)
    engine = AsyncEngine(EngineConfig(model="scripted", max_num_seqs=4), runner=runner,
                         tokenizer=tokenizer)
    async with serve(engine, ServerConfig(stats_interval=0.0)) as server, \
            aiohttp.ClientSession() as http:
        url = base_url(server)
        feed = server.app[STATS_FEED_KEY]
        stuck = feed.subscribe()  # a viewer whose frames are never taken
        async with http.ws_connect(url + "/ws/stats") as a, \
                http.ws_connect(url + "/ws/stats") as b:
            body = {**LOAD, "max_tokens": 30}
            replies = await asyncio.gather(*(http.post(url + "/v1/completions", json=body)
                                             for _ in range(12)))
            assert all(r.status == 200 for r in replies)
            await wait_until(lambda: idle(engine), timeout=10)
            for ws in (a, b):
                frame = await ws.receive_json(timeout=10)
                while frame["num_generated_tokens"] < 12 * 30 or any(frame["slots"]):
                    frame = await ws.receive_json(timeout=10)
                assert frame["ttft"]["p50"] >= 0 and frame["itl"] is not None
        assert stuck.qsize() == feed.queue_size and feed.num_dropped > 0
        feed.unsubscribe(stuck)
        await wait_until(lambda: not feed.viewers, timeout=10)
        assert not engine.listeners.has_step_listeners


async def test_dashboard_page_is_served(tokenizer):
    engine = AsyncEngine(EngineConfig(model="scripted"), runner=ScriptedRunner([7]),
                         tokenizer=tokenizer)
    async with serve(engine) as server, aiohttp.ClientSession() as http:
        for path in ("/", "/dashboard"):
            async with http.get(base_url(server) + path) as response:
                assert response.status == 200
                assert response.content_type == "text/html"
                page = await response.text()
                assert "AIOSERVE.live()" in page and 'id="slots"' in page


async def test_the_feed_sends_at_most_ten_frames_a_second_of_engine_time():
    engine = AsyncEngine(EngineConfig(model="sim", max_num_seqs=4),
                         runner=SimulatedRunner(step_ms=20.0))
    feed = StatsFeed(engine, "sim", queue_size=10_000)  # default interval: 0.1 s
    async with engine:
        feed.attach()
        frames = feed.subscribe()
        await run_requests(engine, 6, 40)
        await wait_until(lambda: idle(engine))
    times = [json.loads(frames.get_nowait())["time"] for _ in range(frames.qsize())]
    first, *ticks, idle_time = times  # the frame on subscribing, then ticks, then idle
    assert len(ticks) >= 5 and idle_time >= ticks[-1]
    assert all(b - a >= 0.1 - 1e-9 for a, b in zip(ticks, ticks[1:]))
