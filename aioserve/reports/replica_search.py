"""The fewest replicas that meet a target SLO attainment at a workload's rate, per policy
and router: the cluster simulator run at replica counts found by bisection.

Attainment is counted as the rate sweep counts it (``aioserve.sim.capacity``: the middle
80% of arrivals). The search assumes attainment does not fall as replicas are added (true
of the built-in routers on one workload, not guaranteed for every router); it checks the
count below the answer, so a reported count always has a failing neighbour below it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aioserve.reports.compare import Table, format_table
from aioserve.reports.sweep import admission_refused, met
from aioserve.sim.capacity import run_point
from aioserve.sim.cluster import simulate_cluster
from aioserve.sim.simulator import SimConfig
from aioserve.workloads.request import WorkloadRequest


@dataclass
class ReplicaSearch:
    """One policy x router: ``replicas`` the fewest meeting ``target`` (None: not within
    ``max_replicas``); ``tried`` replica count -> (attainment 0-1, goodput req/s);
    ``refused`` replica count -> requests the admission limit refused over the replicas
    (``queue_full``, ``queue_timeout``) of ``requests``."""

    policy: str
    router: str
    target: float
    max_replicas: int
    replicas: int | None = None
    tried: dict[int, tuple[float, float]] = field(default_factory=dict)
    refused: dict[int, int] = field(default_factory=dict)
    requests: int = 0


async def fewest_replicas(
    workload: list[WorkloadRequest], policy: str, router: str, config: SimConfig,
    target: float, max_replicas: int, slo_ttft_ms: float | None, slo_tpot_ms: float | None,
    router_params: Mapping[str, Any] | None = None,
    scheduler_params: Mapping[str, Any] | None = None,
) -> ReplicaSearch:
    """Bisect 1..``max_replicas`` for the fewest replicas whose attainment >= ``target``."""
    search = ReplicaSearch(policy, router, target, max_replicas, requests=len(workload))
    rate = len(workload) / max(max(w.arrival_s for w in workload), 1e-9) if workload else 0.0

    async def meets(count: int) -> bool:
        result = await simulate_cluster(workload, count, router, policy, config,
                                        router_params, scheduler_params)
        found = [o for rep in result.replicas for o in met(rep, slo_ttft_ms, slo_tpot_ms)]
        point = run_point(rate, found)
        search.tried[count] = (point.attainment, point.goodput)
        search.refused[count] = sum(admission_refused(rep) for rep in result.replicas)
        return point.attainment >= target

    low, high = 0, max_replicas  # low fails (0 replicas serve nothing); high unknown
    if not await meets(high):
        return search
    while high - low > 1:
        middle = (low + high) // 2
        if await meets(middle):
            high = middle
        else:
            low = middle
    search.replicas = high
    return search


def format_replica_search(searches: list[ReplicaSearch], title: str = "") -> str:
    """One row per policy x router: the fewest replicas, its attainment and goodput per
    replica, and the attainment one replica fewer."""
    rows = []
    for s in searches:
        count = s.max_replicas if s.replicas is None else s.replicas
        attained, goodput = s.tried[count]
        below = None if s.replicas is None else s.tried.get(count - 1)
        rows.append([s.policy, s.router, f"> {count}" if s.replicas is None else str(count),
                     f"{attained * 100:.1f}", f"{goodput / count:.2f}",
                     "-" if below is None else f"{below[0] * 100:.1f}"])
    target = searches[0].target if searches else 0.0
    table = Table("fewest replicas", [
        "policy", "router", f"replicas (SLO >= {target * 100:g}%)", "SLO %",
        "goodput/replica (req/s)", "SLO % one fewer"], rows)
    return "\n".join([title] * bool(title) + [format_table(table)] + refused_lines(searches))


def refused_lines(searches: list[ReplicaSearch]) -> list[str]:
    """What the admission limit refused at each replica count tried, as the rate sweep says
    it (none: no line)."""
    lines = []
    for s in searches:
        if any(s.refused.values()) and s.requests:
            shares = ", ".join(f"{n / s.requests:.0%} ({n} of {s.requests}) at {count}"
                               for count, n in sorted(s.refused.items()))
            lines.append(f"{s.policy} x {s.router}: refused by the admission limit "
                         f"(queue_full, queue_timeout), by replicas: {shares}")
    return lines
