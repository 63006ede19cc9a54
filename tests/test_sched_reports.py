"""Scheduler.report(): what each built-in policy thinks, as plain numbers."""

from __future__ import annotations

import json

import aiohttp
import pytest
from scripted_runner import ScriptedRunner
from server_support import base_url, serve

from aioserve import AsyncEngine, EngineConfig
from aioserve.request_meta import RequestMeta
from aioserve.scheduling.registry import load_scheduler
from aioserve.server.app import METRICS_KEY
from aioserve.server.tenant_labels import TenantLabels
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import heavy_tail

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


async def test_metrics_and_the_stats_feed_carry_the_report(tokenizer):
    engine = AsyncEngine(EngineConfig(model="scripted", scheduler="vtc",
                                      scheduler_config={"weights": {"b": 2.0}}),
                         runner=ScriptedRunner([300]), tokenizer=tokenizer)
    async with serve(engine) as server, aiohttp.ClientSession() as session:
        url = base_url(server)
        for user in ("a", "b", "b"):
            body = {"prompt": [5, 6, 7], "max_tokens": 4, "user": user}
            async with session.post(url + "/v1/completions", json=body) as response:
                assert response.status == 200
        async with session.get(url + "/metrics") as response:
            text = await response.text()
        labels = server.app[METRICS_KEY].tenants.tenant  # the server's one tenant rule
        assert (f'aioserve:policy_report{{key="{labels("b")}",name="weights",policy="vtc"}} '
                "2.0") in text
        assert f'key="{labels("a")}",name="counters",policy="vtc"' in text
        assert 'aioserve:policy_report{key="",name="service_gap",policy="vtc"}' in text
        assert 'aioserve:policy_preemptions_total{policy="vtc"} 0.0' in text
        assert 'aioserve:policy_shed_requests_total{policy="vtc"} 0.0' in text
        async with session.ws_connect(url + "/ws/stats") as ws:
            frame = json.loads((await ws.receive()).data)
        assert frame["policy_report"]["weights"] == {"a": 1.0, "b": 2.0}
        assert frame["policy_report"]["counters"]["a"] > 0


async def test_metrics_label_tenants_pseudonymously_when_open(tokenizer):
    engine = AsyncEngine(EngineConfig(model="scripted", scheduler="vtc"),
                         runner=ScriptedRunner([300]), tokenizer=tokenizer)
    async with serve(engine) as server, aiohttp.ClientSession() as session:
        metrics = server.app[METRICS_KEY]
        metrics.tenants.tenant = TenantLabels(pseudonymous=True)
        url = base_url(server)
        body = {"prompt": [5, 6, 7], "max_tokens": 4, "user": "alice"}
        async with session.post(url + "/v1/completions", json=body) as response:
            assert response.status == 200
        async with session.get(url + "/metrics") as response:
            text = await response.text()
        assert "alice" not in text
        assert f'key="{metrics.tenants.tenant("alice")}",name="counters"' in text
