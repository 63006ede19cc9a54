"""Scheduler.report(): what each built-in policy thinks, as plain numbers."""

from __future__ import annotations

import pytest

from aioserve.request_meta import RequestMeta
from aioserve.scheduling.registry import load_scheduler
from aioserve.sim.scenarios import heavy_tail
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.sim.workloads import WorkloadRequest

#: what each policy reports (keys that must be there)
KEYS = {
    "fcfs": set(),
    "vtc": {"counters", "weights", "service_gap"},
    "mlfq": {"level_occupancy", "evictions", "promoted_share"},
    "spf": {"in_engine", "predicted_mean", "prediction_mae", "prediction_bias"},
    "edf": {"min_slack_s", "mean_slack_s", "late", "hold_s", "step_s", "shed"},
    "priority": {"share", "measured_share", "contested", "protected"},
}


def workload() -> list[WorkloadRequest]:
    return [WorkloadRequest(w.id, w.arrival_s, w.prompt_len, w.output_len,
                            meta=RequestMeta(tenant="ab"[i % 2], priority=i % 3,
                                             ttft_slo_ms=500.0))
            for i, w in enumerate(heavy_tail(n=200, rate=30))]


def plain(report: object) -> bool:
    """A PolicyReport: str -> float, or str -> (str -> float)."""
    if not isinstance(report, dict):
        return False
    for key, value in report.items():
        if not isinstance(key, str):
            return False
        if isinstance(value, dict):
            if not all(isinstance(k, str) and isinstance(v, float) for k, v in value.items()):
                return False
        elif not isinstance(value, float):
            return False
    return True


@pytest.mark.parametrize("name", sorted(KEYS))
async def test_each_builtin_policy_reports_plain_numbers_mid_run(name):
    policy = load_scheduler(name, {"weights": {"b": 2.0}} if name == "vtc" else None)
    seen: list[dict] = []

    def watch(core, feedback) -> None:
        first = policy.report()
        assert policy.report() == first  # reading it changes nothing
        seen.append(first)

    await simulate(workload(), policy, SimConfig(slots=8, kv_blocks=64, step_ms=20),
                   on_step=watch)
    assert all(plain(r) for r in seen)
    assert set(seen[len(seen) // 2]) >= KEYS[name]


async def test_vtc_reports_its_counters_and_weights_by_tenant():
    policy = load_scheduler("vtc", {"weights": {"b": 2.0}})
    await simulate(workload(), policy, SimConfig(slots=8, kv_blocks=64, step_ms=20))
    report = policy.report()
    assert report["weights"] == {"a": 1.0, "b": 2.0}
    assert set(report["counters"]) == {"a", "b"}
    assert report["counters"]["a"] > 0


async def test_priority_reports_its_shares_by_level():
    policy = load_scheduler("priority", {"shares": {"1": 0.15, "2": 0.05}})
    await simulate(workload(), policy, SimConfig(slots=8, kv_blocks=64, step_ms=20))
    report = policy.report()
    assert report["share"] == {"1": 0.15, "2": 0.05}
