"""Issue 48's floor: one outcome record, percentile, SLO rule and goodput. The same finished
requests put through the simulated report and the live (``bench serve``) report give
identical figures."""

from __future__ import annotations

import asyncio

import pytest

from aioserve.bench.online.serving import RequestRecord
from aioserve.reports.figures import makespan, outcomes, policy_figures
from aioserve.reports.serving import summarize
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.scenarios import load_workload


def test_simulated_and_live_reports_agree_on_the_same_requests():
    workload = load_workload("slo-mix:n=40,rate=6")
    result = asyncio.run(simulate(workload, "fcfs", SimConfig(slots=2, step_ms=20)))
    sim = policy_figures(result, slo_ttft_ms=400, slo_tpot_ms=30)
    simulated = outcomes(result)
    assert sim["finished"] == len(simulated) > 0
    # The same requests as a live client records them: sent at arrival, a read per token.
    live = []
    for item, o in zip(result.workload, simulated):
        assert o.first_token_s is not None and o.last_token_s is not None
        n = o.output_tokens
        gap = (o.last_token_s - o.first_token_s) / max(n - 1, 1)
        record = RequestRecord(start=o.arrival_s, output_tokens=n, end=o.finish_s or 0.0,
                               chunk_times=[o.first_token_s + i * gap for i in range(n)])
        live.append(record.outcome(item, 0.0))
    report = summarize(live, makespan(simulated), "completions", slo_ttft_ms=400,
                       slo_tpot_ms=30).metrics
    assert sim["goodput_req_s"] == report["goodput"]
    assert 0 < sim["slo_attainment"] < 1  # the rule bites on some, not all
    assert sim["throughput_req_s"] == report["request_throughput"]
    assert report["ttft"]["mean_ms"] == pytest.approx(sim["mean_ttft_s"] * 1e3, rel=1e-12)
    assert report["ttft"]["median_ms"] == pytest.approx(sim["p50_ttft_s"] * 1e3, rel=1e-12)
    assert report["ttft"]["p99_ms"] == pytest.approx(sim["p99_ttft_s"] * 1e3, rel=1e-12)
    assert report["tpot"]["mean_ms"] == pytest.approx(sim["mean_tpot_s"] * 1e3, rel=1e-9)
    assert report["e2e"]["p99_ms"] == pytest.approx(sim["p99_e2e_s"] * 1e3, rel=1e-12)
