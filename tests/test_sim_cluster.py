"""Issue 32, item 3: the cluster simulator (one replica is ``simulate`` exactly), its
report, the load bound under one hot prompt, and ``simulate --replicas --router``."""

from __future__ import annotations

import math

import pytest

from aioserve.cli import main
from aioserve.reports.cluster import cluster_figures
from aioserve.routing.balance import LeastOutstanding
from aioserve.routing.prefix import PrefixAffinity
from aioserve.sim.cluster import simulate_cluster
from aioserve.sim.simulator import SimConfig, SimResult, simulate
from aioserve.workloads.request import WorkloadRequest, article_example
from aioserve.workloads.scenarios import load_workload


def trace(result: SimResult):
    requests = sorted((k, r.metrics.first_token_time, r.metrics.finished_time,
                       r.output_token_ids, r.metrics.num_preemptions)
                      for k, r in result.finished.items())
    steps = [(s.start_s, s.end_s, s.request_ids, s.num_tokens) for s in result.steps]
    return requests, steps, result.rejected, result.core.prefix_cache_hits


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("spec", ["article-example", "poisson:n=120,rate=30",
                                  "shared-prefix:n=80,rate=40,prompts=3,prefix=64"])
async def test_one_replica_is_simulate_exactly(spec, overlap):
    workload = load_workload(spec)
    config = SimConfig(slots=4, kv_blocks=64, prefill_ms_per_token=0.05, overlap=overlap,
                       enable_prefix_caching=True)
    alone = await simulate(workload, "spf", config)
    cluster = await simulate_cluster(workload, 1, "prefix", "spf", config)
    assert trace(cluster.replicas[0]) == trace(alone)
    assert len(alone.steps) > 20 and alone.preemptions + len(alone.rejected) >= 0


async def test_an_oracle_reads_the_true_lengths_in_a_cluster_as_alone():
    workload = load_workload("heavy-tail:n=80,rate=40")
    config = SimConfig(slots=4, kv_blocks=64)
    params = {"predictor": "oracle"}
    alone = await simulate(workload, "spf", config, scheduler_params=params)
    cluster = await simulate_cluster(workload, 1, "round_robin", "spf", config,
                                     scheduler_params=params)
    assert trace(cluster.replicas[0]) == trace(alone)
    learned = await simulate_cluster(workload, 1, "round_robin", "spf", config)
    assert trace(learned.replicas[0]) != trace(alone)  # the hints change the order


@pytest.mark.parametrize("overlap", [False, True])
async def test_each_replica_runs_as_simulate_would_on_what_it_was_sent(overlap):
    # the router reads loads, but a replica's run depends only on its own requests
    workload = load_workload("shared-prefix:n=120,rate=60,prompts=6,prefix=64")
    config = SimConfig(slots=4, kv_blocks=48, prefill_ms_per_token=0.05, overlap=overlap,
                       enable_prefix_caching=True, max_model_len=512)
    cluster = await simulate_cluster(workload, 3, "prefix", "fcfs", config)
    assert sorted(len(r.workload) for r in cluster.replicas)[0] > 10
    for replica in cluster.replicas:
        alone = await simulate(replica.workload, "fcfs", config)
        assert trace(replica) == trace(alone)


async def test_report_of_the_article_example_on_two_replicas():
    # round robin: A, C, E on replica 0; B, D on 1. Replica 1 runs D's 200 steps (10 s);
    # replica 0 is busy until A's 100th step (5 s).
    result = await simulate_cluster(article_example(), 2, "round_robin", "fcfs")
    assert result.placement == {"A": 0, "B": 1, "C": 0, "D": 1, "E": 0}
    figures = cluster_figures(result)
    assert figures["makespan_s"] == pytest.approx(10.0)
    assert figures["goodput_req_s"] == pytest.approx(0.5)  # no objectives: all 5 count
    rows = figures["per_replica"]
    assert [r["requests"] for r in rows] == [3, 2]
    assert [r["goodput_req_s"] for r in rows] == pytest.approx([0.3, 0.2])
    assert [r["busy_s"] for r in rows] == pytest.approx([5.0, 10.0])
    assert figures["imbalance_requests"] == pytest.approx(3 / 2.5)
    assert figures["imbalance_busy"] == pytest.approx(10 / 7.5)
    assert figures["prefix_hit_rate"] is None  # caching off
    tight = cluster_figures(result, slo_ttft_ms=60)  # E waits one step: 0.1 s to its token
    assert tight["goodput_req_s"] == pytest.approx(0.4)
    assert tight["slo_attainment"] == pytest.approx(0.8)


async def test_prefix_affinity_pays_on_shared_prompts():
    workload = load_workload("shared-prefix:n=200,rate=20,prompts=12,prefix=256,hot=0.3")
    config = SimConfig(slots=8, kv_blocks=96, step_ms=20, prefill_ms_per_token=0.2,
                       enable_prefix_caching=True)
    runs = {name: cluster_figures(await simulate_cluster(workload, 4, name, "fcfs", config))
            for name in ("round_robin", "prefix")}
    prefix, spread = runs["prefix"], runs["round_robin"]
    assert prefix["prefix_hit_rate"] > spread["prefix_hit_rate"] + 0.1
    assert prefix["mean_ttft_s"] < spread["mean_ttft_s"]
    for figures in runs.values():
        rows = figures["per_replica"]
        queries = sum(r["prompt_tokens"] for r in rows)
        assert 0 < figures["prefix_hit_rate"] < 1 and queries > 0


class Checked(PrefixAffinity):
    """The prefix router, checking its own bound at every decision."""

    def choose(self, request, loads):
        index = super().choose(request, loads)
        values = [load.outstanding_requests for load in loads]
        mean = (sum(values) + 1) / len(values)
        assert values[index] + 1 <= math.ceil(max(1.25 * mean, mean + 2))
        self.seen = getattr(self, "seen", 0) + 1
        return index


async def test_the_bound_holds_with_one_hot_prompt():
    workload = load_workload("shared-prefix:n=150,rate=200,prompts=1,prefix=128")
    config = SimConfig(slots=4, kv_blocks=128, enable_prefix_caching=True)
    router = Checked()
    bounded = await simulate_cluster(workload, 4, router, "fcfs", config)
    assert router.seen == 150
    assert {i: sum(1 for v in bounded.placement.values() if v == i) for i in range(4)} \
        == {i: len(r.workload) for i, r in enumerate(bounded.replicas)}
    assert min(len(r.workload) for r in bounded.replicas) > 20
    pinned = await simulate_cluster(workload, 4, "prefix", "fcfs", config,
                                    router_params={"load_bound": 1e9})
    assert sorted(len(r.workload) for r in pinned.replicas) == [0, 0, 0, 150]


async def test_a_router_choosing_no_replica_is_an_error():
    class Bad:
        name = "bad"

        def choose(self, request, loads):
            return len(loads)

    with pytest.raises(ValueError, match="chose 2, not a replica 0..1"):
        await simulate_cluster(article_example(), 2, Bad(), "fcfs")


def test_cli_prints_a_table_per_router(capsys):
    status = main(["simulate", "--workload", "shared-prefix:n=40,rate=20,prompts=2,prefix=32",
                   "--replicas", "2", "--router", "round_robin,prefix", "--enable-prefix-caching",
                   "--router-config", '{"prefix": {"load_bound": 0.5}}', "--json"])
    out = capsys.readouterr().out
    assert status == 0
    assert "round_robin (fcfs): per replica" in out and "prefix (fcfs): per replica" in out
    assert out.count('"router": ') == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--router", "nope"], "--router: unknown router 'nope'; registered: least_outstanding, "
                           "pow2, prefix, round_robin"),
    (["--router", "prefix", "--router-config", '{"eps": 1}'],
     "--router-config: router 'prefix' has no parameter 'eps'"),
    (["--router-config", "[1]"], "--router-config: must be a JSON object"),
    (["--replicas", "2", "--real"], "--real: not with --replicas"),
    (["--replicas", "2", "--scheduler", "nope"], "--scheduler/--scheduler-config: unknown"),
])
def test_cli_refuses_before_running(argv, message, capsys):
    assert main(["simulate", "--workload", "poisson:n=5", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


async def test_loads_count_what_was_sent_and_has_not_ended():
    seen = []

    class Recording(LeastOutstanding):
        def choose(self, request, loads):
            seen.append([(load.outstanding_requests, load.outstanding_tokens) for load in loads])
            return super().choose(request, loads)

    workload = [WorkloadRequest("a", 0.0, 16, 4), WorkloadRequest("b", 1.0, 16, 4),
                WorkloadRequest("c", 1.0, 10, 2, max_tokens=6)]
    result = await simulate_cluster(workload, 2, Recording(), "fcfs")
    # a ended at 0.2 s; b, sent at 1.0 s, counts on replica 0 before it is queued there,
    # as its prompt + its max_tokens: none given, so the context left (2048 - 16)
    assert seen == [[(0, 0), (0, 0)], [(0, 0), (0, 0)], [(1, 2048), (0, 0)]]
    assert result.placement == {"a": 0, "b": 0, "c": 1}


async def test_fewest_replicas_meets_the_target_and_one_fewer_does_not():
    from aioserve.reports.replica_search import fewest_replicas
    from aioserve.reports.sweep import met
    from aioserve.sim.capacity import run_point

    workload = load_workload("poisson:n=300,rate=10,seed=1")
    config = SimConfig(slots=4, step_ms=20)
    search = await fewest_replicas(workload, "fcfs", "least_outstanding", config, 0.9, 16,
                                   500.0, None)
    assert search.replicas is not None and 1 < search.replicas < 16

    async def attainment(count: int) -> float:
        result = await simulate_cluster(workload, count, "least_outstanding", "fcfs", config)
        found = [o for rep in result.replicas for o in met(rep, 500.0, None)]
        return run_point(10.0, found).attainment

    assert await attainment(search.replicas) >= 0.9 > await attainment(search.replicas - 1)
    assert search.tried[search.replicas][0] == await attainment(search.replicas)


async def test_fewest_replicas_says_when_none_within_the_bound():
    from aioserve.reports.replica_search import fewest_replicas, format_replica_search

    workload = load_workload("poisson:n=200,rate=40,seed=1")
    search = await fewest_replicas(workload, "fcfs", "round_robin",
                                   SimConfig(slots=2, step_ms=20), 0.99, 2, 50.0, None)
    assert search.replicas is None and list(search.tried) == [2]
    assert "> 2" in format_replica_search([search])


@pytest.mark.parametrize(("argv", "message"), [
    (["--fewest-replicas", "4", "--replicas", "2"], "--replicas: not an option of aioserve "
                                                    "capacity; aioserve simulate takes it"),
    (["--fewest-replicas", "4", "--target-attainment", "1.5"], "--target-attainment: must be"),
])
def test_cli_refuses_a_bad_replica_search(argv, message, capsys):
    assert main(["simulate", "--workload", "poisson:n=5", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
