"""Issue 34, item 6: the operator's stats line reports rates over the time the engine was
busy; an idle spell between two lines is left out of the rate and said. Snapshots driven
directly, and the engine's idle counter measured on the simulator's virtual clock."""

from __future__ import annotations

import logging

import pytest

from aioserve import AsyncEngine, EngineConfig
from aioserve.engine.observation import StepSnapshot
from aioserve.server.operator_log import StatsLogger
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest


def snapshot(time: float, step: int, tokens: int, idle_s: float) -> StepSnapshot:
    return StepSnapshot(step, time, "fcfs", (None,) * 4, (), 0, 2, 10, 16, 0, tokens, (),
                        idle_s)


def test_the_first_line_after_an_idle_spell_rates_the_busy_time_only(caplog):
    stats = StatsLogger(AsyncEngine(EngineConfig(model="unused")), interval=10.0)
    caplog.set_level(logging.INFO, logger="aioserve.serve")
    stats.on_step(snapshot(0.0, 0, 0, 0.0))
    stats.on_step(snapshot(4.0, 40, 400, 0.0))  # 4 s busy: no line yet
    stats.on_step(snapshot(4.0, 40, 400, 0.0))  # the engine goes idle
    stats.on_step(snapshot(150.0, 41, 410, 140.0))  # idle 140 s, then 6 s busy
    stats.on_step(snapshot(160.0, 141, 1410, 140.0))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "running: 0 reqs, waiting: 0 reqs, KV cache: 20.0%, generation: 41.0 tokens/s "
        "(last 10.0 s busy, idle 140.0 s: 41 steps, 0 preemptions)",
        "running: 0 reqs, waiting: 0 reqs, KV cache: 20.0%, generation: 100.0 tokens/s "
        "(last 10.0 s busy: 100 steps, 0 preemptions)",
    ]


async def test_the_engine_counts_the_time_it_waited_with_nothing_to_run():
    workload = [WorkloadRequest("a", 0.0, 8, 20), WorkloadRequest("b", 100.0, 8, 20)]
    snapshots: list[StepSnapshot] = []

    class Keep:
        def on_step(self, snap: StepSnapshot) -> None:
            snapshots.append(snap)

        def on_finish(self, request: object) -> None:
            pass

    result = await simulate(workload, "fcfs", SimConfig(), listener=Keep())
    a_done = max(s.end_s for s in result.steps if "a" in s.request_ids)
    b_start = min(s.start_s for s in result.steps if "b" in s.request_ids)
    assert a_done < 100.0 <= b_start
    assert snapshots[0].idle_s == 0.0
    assert snapshots[-1].idle_s == pytest.approx(100.0 - a_done, abs=1e-6)
