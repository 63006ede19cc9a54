"""A fair-share policy in under 30 lines: slots go round-robin across tenants.

The tenant is what the client sent as the OpenAI ``user`` field (or an ``X-Tenant``
header); requests without one share the tenant None. Load it as
``--scheduler custom_scheduler:FairShareScheduler`` with this directory on
``sys.path``, or register it as an entry point (see docs/schedulers.md):

    [project.entry-points."aioserve.schedulers"]
    fair_share = "custom_scheduler:FairShareScheduler"
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from aioserve.scheduling import Scheduler, SchedulerOutput, SchedulerState


class FairShareScheduler(Scheduler):
    """Fill free slots one tenant at a time: the tenant with the fewest running requests
    goes next, its oldest waiting request first. The engine's admission arithmetic
    (slots, token budget, KV blocks) decides how many fit; the engine preempts the
    newest request when the KV cache runs out."""

    name: ClassVar[str] = "fair_share"

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        load = Counter(r.tenant for r in state.running)
        queue = list(state.waiting)
        admission = state.admission()
        while queue:
            pick = min(queue, key=lambda r: load[r.tenant])  # min keeps queue order on ties
            if not admission.fits(pick):
                break
            admission.admit(pick)
            queue.remove(pick)
            load[pick.tenant] += 1
        return SchedulerOutput(admit=admission.admitted)


if __name__ == "__main__":  # run alone: this policy beside FCFS on a simulated burst
    import asyncio

    from aioserve.request_meta import RequestMeta
    from aioserve.sim.simulator import SimConfig, simulate
    from aioserve.workloads.request import WorkloadRequest

    alice, bob = RequestMeta(tenant="alice"), RequestMeta(tenant="bob")
    burst = [WorkloadRequest(f"alice-{i}", 0.0, 8, 20, meta=alice) for i in range(12)]
    burst += [WorkloadRequest(f"bob-{i}", 0.01, 8, 20, meta=bob) for i in range(3)]
    print("alice sends 12 requests at t=0, bob 3 at t=10 ms; 4 slots, 50 ms steps")
    for policy in ("fcfs", FairShareScheduler()):
        result = asyncio.run(simulate(burst, policy, SimConfig(slots=4)))
        for who in ("alice", "bob"):
            ends = [r.metrics.finished_time - r.arrival_time for r in result.finished.values()
                    if r.meta.tenant == who]
            print(f"{result.scheduler:>10} {who:>5}: mean latency {sum(ends) / len(ends):.2f} s")
