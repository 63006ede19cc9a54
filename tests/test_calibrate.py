"""``calibrate()`` on the real engine: it fits the steps of its rounds of the workload and of
each workload in ``also``, and none of its warm-up."""

from __future__ import annotations

from aioserve import AsyncEngine, EngineConfig
from aioserve.scheduling import StepFeedback
from aioserve.sim.calibrate import calibrate
from aioserve.workloads.request import WorkloadRequest


async def test_calibrate_fits_its_rounds_and_the_also_workloads_not_the_warm_up(model_dir):
    burst = [WorkloadRequest(f"b{i}", 0.0, 8 + i, 6 + i) for i in range(8)]
    spread = [WorkloadRequest(f"s{i}", 0.02 * i, 8 + i, 6 + i) for i in range(4)]
    async with AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=8)) as engine:
        seen: list[StepFeedback] = []
        engine.add_step_observer(seen.append)
        model = await calibrate(engine, burst, rounds=2, also=[spread])
    # The warm-up replays burst[:4]: at least 9 steps (b3 emits 9 tokens), less one that may
    # still be in flight when it ends (its feedback then counts with the next replay).
    # Every step that ran a request the warm-up does not hold is fitted.
    rounds = sum(not set(step.request_ids) <= {"b0", "b1", "b2", "b3"} for step in seen)
    assert rounds <= model.fit["steps"] <= len(seen) - 8
    assert sum(any(r.startswith("s") for r in step.request_ids) for step in seen) >= 2 * 9
