"""A fair-share policy in about 30 lines: slots go round-robin across tenants.

The tenant is the part of the request id before the first "-" ("alice-7" -> "alice").
Load it as ``EngineConfig(scheduler="custom_scheduler:FairShareScheduler")`` with this
directory on ``sys.path``, or register it as an entry point (see docs/schedulers.md):

    [project.entry-points."aioserve.schedulers"]
    fair_share = "custom_scheduler:FairShareScheduler"
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from aioserve.scheduling import RequestView, Scheduler, SchedulerOutput, SchedulerState


def tenant(request: RequestView) -> str:
    """The tenant a request belongs to."""
    return request.request_id.split("-", 1)[0]


class FairShareScheduler(Scheduler):
    """Fill free slots one tenant at a time: the tenant with the fewest running requests
    goes next, its oldest waiting request first. Never preempts itself; the engine
    preempts the newest request when the KV cache runs out and checks every admission
    against slots, the token budget and free blocks."""

    name: ClassVar[str] = "fair_share"

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        load = Counter(tenant(r) for r in state.running)
        queue = list(state.waiting)
        admit: list[str] = []
        for _ in range(min(state.max_num_seqs - len(state.running), len(queue))):
            pick = min(queue, key=lambda r: load[tenant(r)])  # min keeps queue order on ties
            queue.remove(pick)
            load[tenant(pick)] += 1
            admit.append(pick.request_id)
        return SchedulerOutput(admit=admit)


def _demo() -> None:
    """Run alone: compare this policy with FCFS on a simulated two-tenant burst (no
    model needed) and print each tenant's mean latency."""
    import asyncio
    from statistics import mean

    from aioserve.sim.simulator import SimConfig, simulate
    from aioserve.sim.workloads import WorkloadRequest

    # alice floods the queue at t=0; bob's three requests arrive 10 ms later.
    workload = [WorkloadRequest(f"alice-{i}", 0.0, 8, 20) for i in range(12)]
    workload += [WorkloadRequest(f"bob-{i}", 0.01, 8, 20) for i in range(3)]
    config = SimConfig(slots=4, step_ms=50.0)
    print("4 slots, 50 ms steps; alice sends 12 requests at t=0, bob 3 at t=10 ms "
          "(20 output tokens each)\n")
    print(f"{'policy':<12} {'alice mean latency':>20} {'bob mean latency':>18}")
    for policy in ("fcfs", FairShareScheduler()):
        result = asyncio.run(simulate(workload, policy, config))
        latency: dict[str, list[float]] = {}
        for request in result.finished.values():
            m = request.metrics
            assert m.finished_time is not None
            latency.setdefault(tenant(request), []).append(m.finished_time - m.arrival_time)
        print(f"{result.scheduler:<12} {mean(latency['alice']):>18.2f} s "
              f"{mean(latency['bob']):>16.2f} s")
    print("\nServe with it: aioserve serve --model MODEL "
          "--scheduler custom_scheduler:FairShareScheduler  (this directory on PYTHONPATH)")


if __name__ == "__main__":
    _demo()
