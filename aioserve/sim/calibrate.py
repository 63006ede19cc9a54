"""Calibration: run a short workload on the real engine and fit the simulator's step cost."""

from __future__ import annotations

import random
from collections.abc import Sequence

from aioserve.engine import AsyncEngine
from aioserve.engine.step_log import describe
from aioserve.sim.real import replay
from aioserve.sim.step_cost import StepCostModel, fit_profile
from aioserve.workloads.request import WorkloadRequest


def calibration_workload(max_num_seqs: int, seed: int = 0, max_model_len: int = 512
                         ) -> list[WorkloadRequest]:
    """Steps of every shape the engine meets: solo requests, a burst of twice
    ``max_num_seqs`` (prompts 8-128) and long prompts among short outputs (a quarter to half
    of ``max_model_len``; outputs 4-96)."""
    rng = random.Random(seed)
    long = max(max_model_len // 2, 16)
    items: list[WorkloadRequest] = []
    t = 0.0
    for i in range(max(4, max_num_seqs // 2)):  # one at a time
        items.append(WorkloadRequest(f"cal-solo-{i}", round(t, 4), rng.randint(8, 64),
                                     rng.randint(4, 24)))
        t += 0.15
    for i in range(2 * max_num_seqs):  # a burst
        items.append(WorkloadRequest(f"cal-burst-{i}", round(t + 0.002 * i, 4),
                                     rng.randint(8, 128), rng.randint(16, 96)))
    t += 0.6
    for i in range(max_num_seqs):  # long prompts, arriving while others decode
        items.append(WorkloadRequest(f"cal-long-{i}", round(t + 0.03 * i, 4),
                                     rng.randint(long // 2, long), rng.randint(4, 32)))
    return items


async def calibrate(engine: AsyncEngine, workload: list[WorkloadRequest] | None = None,
                    rounds: int = 2, also: Sequence[list[WorkloadRequest]] = ()
                    ) -> StepCostModel:
    """Fit the step cost of a running, idle ``engine`` on ``rounds`` passes of ``workload``
    and of each of ``also`` (e.g. the same requests at the rates they will be served: a
    machine may run slower after idling between arrivals) under ``fcfs``, after a warm-up
    (ValueError: too few steps; RuntimeError: busy)."""
    core = engine._require_core()
    workload = workload or calibration_workload(core.max_num_seqs,
                                                max_model_len=core.max_model_len)
    await replay(engine, workload[: max(4, len(workload) // 4)], "fcfs")  # warm-up
    steps = []
    for each in (workload, *also):
        for _ in range(rounds):
            steps += (await replay(engine, each, "fcfs")).feedback
    return fit_profile(steps, source=describe(engine))

