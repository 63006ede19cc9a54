"""A policy's close(): the learned predictor saves every length it learnt on shutdown."""

from __future__ import annotations

import json
from pathlib import Path

from scripted_runner import ScriptedRunner

from aioserve import AsyncEngine, EngineConfig
from aioserve.sampling_params import SamplingParams
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.scenarios import routes
from schedulers.fcfs import FCFSScheduler


def saved_lengths(path: Path) -> list[int]:
    """The lengths of the coarsest class (every request) in a saved state."""
    return sorted(json.loads(path.read_text())["classes"]["*"])


async def test_engine_shutdown_saves_every_finished_length(tmp_path):
    path = tmp_path / "lengths.json"
    params = {"predictor_config": {"state_path": str(path), "save_every": 1000}}
    config = EngineConfig(model="scripted", scheduler="spf", scheduler_config=params)
    lengths = [3, 5, 8, 13, 21]
    async with AsyncEngine(config, runner=ScriptedRunner([300])) as engine:
        streams = [engine.add_request([5, 6, 7], SamplingParams(max_tokens=100), f"r{i}",
                                      stop_after=n) for i, n in enumerate(lengths)]
        for stream in streams:
            while not (await stream.queue.get()).finished:
                pass
        assert not path.exists()                        # fewer than save_every finished
    assert saved_lengths(path) == lengths               # written by the shutdown


async def test_the_end_of_a_simulator_run_saves_every_finished_length(tmp_path):
    path = tmp_path / "lengths.json"
    workload = routes(n=50, rate=5.0)
    params = {"predictor_config": {"state_path": str(path), "save_every": 1000}}
    await simulate(workload, "spf", SimConfig(slots=8, step_ms=20), scheduler_params=params)
    assert saved_lengths(path) == sorted(item.output_len for item in workload)


class Closing(FCFSScheduler):
    """FCFS that counts its close() calls and then raises."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    def close(self) -> None:
        self.closed += 1
        raise RuntimeError("disk full")


async def test_close_is_called_once_and_contained():
    policy, successor = Closing(), Closing()
    engine = AsyncEngine(EngineConfig(model="scripted"), runner=ScriptedRunner([2]),
                         scheduler=policy)
    await engine.start()
    assert engine.core is not None
    engine.core.set_policy(successor)                   # the replaced policy is closed
    assert (policy.closed, successor.closed) == (1, 0)
    await engine.shutdown()
    await engine.shutdown()
    assert (policy.closed, successor.closed) == (1, 1)
    assert engine.core.guard.failures == 1              # the successor's raise, contained
