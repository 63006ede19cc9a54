"""Issue 26, items 1 and 7: the real runner with its thread governor and its default
forward: the governor changes the team's size on the worker thread without changing a
token, /metrics and the start-up summary say how many threads compute, and the default
forward is the lean one where its probe passes."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest
import torch
from server_support import base_url, metric, serve

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.bench.models import coverage
from aioserve.runners.cpu.threads.cpu_load import LoadReading, LoadWindow
from aioserve.runners.torch import setup as runner_setup
from aioserve.runners.torch.runner import TorchRunner
from aioserve.server.operator_log import startup_summary


@pytest.fixture
def two_cpus(monkeypatch):
    """Two usable CPUs whatever the machine has (the governor needs more than one)."""
    monkeypatch.delenv("AIOSERVE_NUM_THREADS", raising=False)
    monkeypatch.setattr(runner_setup, "usable_cpus", lambda: 2)


class SwingingMeter:
    """Each window alternately says "two co-tenants took the CPUs" and "they left"."""

    cpus = frozenset({0, 1})
    tick_s = 0.01

    def __init__(self) -> None:
        self.reads = 0
        self.threads: list[int] = []

    def read(self) -> LoadReading:
        self.reads += 1
        self.threads.append(threading.get_ident())
        return LoadReading(float(self.reads), 0.0, 0.0, 0.0, 0.0)

    def window(self, start: LoadReading, end: LoadReading) -> LoadWindow:
        if self.reads % 2:
            return LoadWindow(1.0, 1.0, 0.0, 0.5, 0.5, 2)  # loaded: half a CPU waited
        return LoadWindow(1.0, 0.05, 1.95, 0.0, 0.0, 2)  # quiet (the engine idle or not)

    def close(self) -> None:
        pass


async def test_the_governor_moves_the_team_mid_generation_without_changing_a_token(
        model_dir, two_cpus, solo_greedy):
    config = EngineConfig(model=model_dir, device="cpu", max_num_seqs=8, num_kv_blocks=128)
    runner = TorchRunner(config)
    governor = runner.governor
    assert governor is not None and governor.counts == [1, 2]
    meter, seen = SwingingMeter(), []
    governor.meter, governor._reading, governor.window_s = meter, meter.read(), 0.0
    governor.up_hold_s = governor.UP_HOLD_S = governor.MIN_MOVE_GAP_S = 0.0
    governor.set_threads = lambda n: (seen.append((n, threading.get_ident())),
                                      torch.set_num_threads(n))
    prompts = [[1, 300 + i, 400 - i, 17 * i % 500] for i in range(6)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    async with AsyncEngine(config, runner=runner) as engine:
        async def one(prompt):
            return [t async for out in engine.generate(prompt, params) for t in out.token_ids]

        outputs = await asyncio.gather(*(one(p) for p in prompts))
        worker = runner._executor.submit(threading.get_ident).result()
    assert governor.moves >= 4 and {n for n, _ in seen} == {1, 2}
    assert {ident for _, ident in seen} == {worker}  # torch's count is set on the worker
    for prompt, tokens in zip(prompts, outputs):
        assert tokens == solo_greedy(prompt, 24)


async def test_metrics_and_summary_show_the_threads_in_use(model_dir, two_cpus):
    config = EngineConfig(model=model_dir, device="cpu", num_kv_blocks=64, max_num_seqs=4)
    engine = AsyncEngine(config)
    async with serve(engine) as server, aiohttp.ClientSession() as http:
        async with http.get(base_url(server) + "/metrics") as r:
            text = await r.text()
        governor = engine.runner.governor
        assert metric(text, "aioserve:cpu_threads") == governor.threads == 2
        governor.threads = 1  # as after a move
        async with http.get(base_url(server) + "/metrics") as r:
            assert metric(await r.text(), "aioserve:cpu_threads") == 1
        summary = startup_summary(engine)
    assert "may use 1, 2" in summary and "lean-llama (auto" in summary


async def test_the_variable_pins_the_count_with_no_governor(model_dir, monkeypatch):
    monkeypatch.setenv("AIOSERVE_NUM_THREADS", "1")
    config = EngineConfig(model=model_dir, device="cpu", num_kv_blocks=64, max_num_seqs=4)
    engine = AsyncEngine(config)
    async with serve(engine) as server, aiohttp.ClientSession() as http:
        async with http.get(base_url(server) + "/metrics") as r:
            assert metric(await r.text(), "aioserve:cpu_threads") == 1
        assert engine.runner.governor is None
        assert "1 intra-op thread(s), fixed" in startup_summary(engine)


def test_the_default_forward_is_lean_where_its_probe_passes_else_transformers(
        model_dir, tmp_path):
    assert EngineConfig(model="m").forward == "auto"
    lean = TorchRunner(EngineConfig(model=model_dir, device="cpu", num_kv_blocks=16))
    plain = TorchRunner(EngineConfig(model=model_dir, device="cpu", num_kv_blocks=16,
                                     forward="transformers"))
    few = TorchRunner(EngineConfig(model=model_dir, device="cpu", num_kv_blocks=2))
    coverage.save("qwen2", tmp_path / "qwen2", model_dir)
    other = TorchRunner(EngineConfig(model=str(tmp_path / "qwen2"), device="cpu",
                                     num_kv_blocks=16))
    try:
        assert lean.lean is not None and lean.forward_note.startswith("lean-llama (auto")
        assert plain.lean is None and plain.forward_note == "transformers"
        assert few.lean is None and "at least 4 KV blocks" in few.forward_note
        assert other.lean is None and other.forward_note.startswith("transformers (auto")
    finally:
        for runner in (lean, plain, few, other):
            runner.close()
    with pytest.raises(ValueError, match="forward"):
        EngineConfig(model="m", forward="fast")
