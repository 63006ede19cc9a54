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



if __name__ == "__main__":  # run alone: this policy beside FCFS on a simulated burst
    import asyncio

    from aioserve.sim.simulator import SimConfig, simulate
    from aioserve.sim.workloads import WorkloadRequest

    burst = [WorkloadRequest(f"alice-{i}", 0.0, 8, 20) for i in range(12)]
    burst += [WorkloadRequest(f"bob-{i}", 0.01, 8, 20) for i in range(3)]
    print("alice sends 12 requests at t=0, bob 3 at t=10 ms; 4 slots, 50 ms steps")
    for policy in ("fcfs", FairShareScheduler()):
        result = asyncio.run(simulate(burst, policy, SimConfig(slots=4)))
        for who in ("alice", "bob"):
            ends = [r.metrics.finished_time - r.arrival_time for r in result.finished.values()
                    if tenant(r) == who]
            print(f"{result.scheduler:>10} {who:>5}: mean latency {sum(ends) / len(ends):.2f} s")
