"""Shortest-predicted-first: order by predicted length, and aging so a long job is not
starved by a stream of short ones (CASES.md BUG-11)."""

from __future__ import annotations

import math
import random

import pytest

from aioserve.reports.figures import policy_figures
from aioserve.scheduling import RequestView
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest, article_example
from schedulers.length_predictor import LengthPredictor
from schedulers.spf import SPFScheduler

STEP_S = 0.05
SHORT_RUN_S = 4 * STEP_S


def starvation_workload(shorts: int = 1000) -> list[WorkloadRequest]:
    """BUG-11: one slot; a 400-token job and a 4-token job at t=0, then a 4-token job
    every engine step. Each client tells its length (``length_hint``): starvation needs a
    policy that knows the long job is long, and max_tokens no longer tells it (a cap)."""
    items = [WorkloadRequest("long", 0.0, 8, 400, length_hint=400)]
    items += [WorkloadRequest(f"s{i:04d}", round(i * STEP_S, 6), 8, 4, length_hint=4)
              for i in range(shorts)]
    return items


async def test_long_job_starts_within_the_aging_bound():
    result = await simulate(starvation_workload(), SPFScheduler(), SimConfig(slots=1))
    long = result.finished["long"].metrics
    waited = long.first_scheduled_time - long.arrival_time
    # documented bound: max_wait_s, plus the time until the slot frees (one short job)
    assert 30.0 <= waited <= 30.0 + SHORT_RUN_S
    assert result.finished["long"].num_output_tokens == 400
    assert len(result.finished) == 1001
    # equal predictions keep FCFS order, aged or not
    starts = [result.finished[f"s{i:04d}"].metrics.first_scheduled_time for i in range(1000)]
    assert starts == sorted(starts)


async def test_without_aging_the_long_job_starves():
    policy = SPFScheduler(max_wait_s=math.inf)
    result = await simulate(starvation_workload(200), policy, SimConfig(slots=1))
    long = result.finished["long"].metrics
    last_short = max(r.metrics.finished_time for k, r in result.finished.items() if k != "long")
    assert long.first_scheduled_time == last_short  # it ran only once no short job was left


class ReversePredictor(LengthPredictor):
    """Predicts long jobs short and short jobs long (a pluggable, deliberately bad one)."""

    def predict(self, request: RequestView) -> int:
        return 1000 - (request.params.length_hint or 0)


async def test_order_follows_the_predictor():
    workload = [WorkloadRequest(k, 0.0, 4, n, length_hint=n)
                for k, n in [("a", 30), ("b", 10), ("c", 20)]]
    by_hint = await simulate(workload, SPFScheduler(), SimConfig(slots=1))
    assert [r for r in by_hint.finished] == ["b", "c", "a"]
    reverse = await simulate(workload, SPFScheduler(ReversePredictor()), SimConfig(slots=1))
    assert [r for r in reverse.finished] == ["a", "c", "b"]


async def test_hint_overrides_max_tokens_and_article_example_matches_fcfs():
    workload = [
        WorkloadRequest("told-short", 0.0, 4, 30, length_hint=1),
        WorkloadRequest("really-short", 0.0, 4, 5),
    ]
    result = await simulate(workload, "spf", SimConfig(slots=1))
    assert list(result.finished) == ["told-short", "really-short"]
    # E arrives after the batch starts: spf has nothing to reorder, so fcfs's figures hold
    spf = await simulate(article_example(), "spf")
    latency = {k: r.metrics.finished_time - r.metrics.arrival_time for k, r in spf.finished.items()}
    assert latency == {"A": 5.0, "B": 1.0, "C": 2.5, "D": 10.0, "E": 2.5}


async def test_aged_requests_get_a_share_not_every_admission():
    # Two slots at 7x overload (a 4- or 64-token job every 0.25 s): every request waits
    # past max_wait_s. Aged-first made spf exactly fcfs here (1.000x mean E2E); with
    # half the admissions the order is kept (0.86x) and no wait is longer than fcfs's.
    rng = random.Random(0)
    lengths = [4 if rng.random() < 0.5 else 64 for _ in range(120)]
    workload = [WorkloadRequest(f"r{i:03d}", i * 0.25, 8, n, length_hint=n)
                for i, n in enumerate(lengths)]
    config = SimConfig(slots=2)
    fcfs = policy_figures(await simulate(workload, "fcfs", config))
    policy = SPFScheduler(predictor="hint", max_wait_s=2.0)
    spf = policy_figures(await simulate(workload, policy, config))
    assert spf["mean_e2e_s"] <= 0.9 * fcfs["mean_e2e_s"]
    assert spf["max_wait_s"] <= fcfs["max_wait_s"]
    assert abs(policy.shared / policy.contested - 0.5) <= 0.05
    with pytest.raises(ValueError, match=r"aged_share must be in \(0, 1\]"):
        SPFScheduler(aged_share=0)
