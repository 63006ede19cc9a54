"""Contract v4: one eviction order. ``OrderedScheduler.victims`` is what the engine
evicts by when KV blocks run short mid-step, as ``preempt_for_growth`` does before a step;
``choose_victim`` is gone from the base class (v1-v3 policies that define it are still
asked, tests/test_sched_contract_v2.py)."""

from __future__ import annotations

from typing import ClassVar

from aioserve.scheduling import (
    CONTRACT_VERSION,
    OrderedScheduler,
    Scheduler,
    SchedulerOutput,
    SchedulerState,
)
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest


class OldestFirst(OrderedScheduler):
    """Admits only (the engine must evict); its victims: oldest first, or a bug."""

    name: ClassVar[str] = "oldest_first"

    def __init__(self, broken: bool = False) -> None:
        super().__init__(watermark=0.0)
        self.broken, self.asked = broken, 0

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        return SchedulerOutput(admit=state.admission().fill(state.waiting))

    def victims(self, state):
        self.asked += 1
        if self.broken:
            raise RuntimeError("policy bug")
        return list(state.running)


class NewestFirst(OldestFirst):
    victims = OrderedScheduler.victims  # the default order: the engine does not ask


def workload() -> list[WorkloadRequest]:
    # the oldest request needs a block while newer ones are not scheduled yet
    return [WorkloadRequest(f"r{i}", 0.0, 1 + i, 12) for i in range(3)]


def preempted(result) -> dict[str, int]:
    return {k: r.metrics.num_preemptions for k, r in result.finished.items()}


async def test_the_engine_evicts_by_the_policys_victims():
    assert CONTRACT_VERSION == 4 and not hasattr(Scheduler, "choose_victim")
    config = SimConfig(slots=3, kv_blocks=5, block_size=4)
    default = await simulate(workload(), NewestFirst(), config)
    policy = OldestFirst()
    chosen = await simulate(workload(), policy, config)
    assert policy.asked > 0 and chosen.preemptions > 0 and chosen.core.guard.failures == 0
    assert preempted(chosen) != preempted(default)  # its order, not the engine's newest
    assert all(r.num_output_tokens == 12 for r in chosen.finished.values())


async def test_a_failing_victims_is_contained_and_the_newest_goes():
    config = SimConfig(slots=3, kv_blocks=5, block_size=4)
    default = await simulate(workload(), NewestFirst(), config)
    broken = OldestFirst(broken=True)
    result = await simulate(workload(), broken, config)
    assert result.core.guard.failures >= 1 and broken.asked > 0
    assert preempted(result) == preempted(default)
