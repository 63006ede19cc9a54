"""Calibration: run a short workload on the real engine and fit the simulator's step cost."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from aioserve.engine import AsyncEngine
from aioserve.engine.step_log import describe
from aioserve.sim.real import replay
from aioserve.sim.simulator import SimConfig
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


async def match_throughput(config: SimConfig, measured_req_s: float,
                           throughput: Callable[[SimConfig], Awaitable[float]]
                           ) -> tuple[SimConfig, float]:
    """``config`` with its profile scaled by the factor at which ``throughput(config)`` (a
    simulated burst's requests per second) equals ``measured_req_s`` (the same burst served
    for real), and the factor. What a served path adds to each step (HTTP, streams, a proxy
    on the same cores), which an in-process calibration does not see, folded into one
    number; two fixed-point rounds (a burst's throughput is about inverse to its step cost).

    Raises:
        ValueError: ``config`` has no profile, or ``measured_req_s`` is not > 0."""
    if config.cost_model is None:
        raise ValueError("match_throughput needs a calibrated profile (SimConfig.cost_model)")
    if not measured_req_s > 0:
        raise ValueError(f"measured_req_s must be > 0, got {measured_req_s!r}")
    profile, factor = config.cost_model, 1.0
    for _ in range(2):
        simulated = await throughput(replace(config, cost_model=profile.scaled(factor)))
        factor *= simulated / measured_req_s
    return replace(config, cost_model=profile.scaled(factor)), factor
