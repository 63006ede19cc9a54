"""SimulatedRunner's cost model and scripted tokens, and the simulator's workloads."""

from __future__ import annotations

import json

import pytest

from aioserve.runners.base import ScheduledBatch
from aioserve.sim.runner import SimulatedRunner
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest, load_jsonl, poisson
from aioserve.workloads.scenarios import load_workload


def batch(tokens: list[list[int]], produced: list[int]) -> ScheduledBatch:
    n = len(tokens)
    return ScheduledBatch(
        [f"r{i}" for i in range(n)], [len(t) for t in tokens], [0] * n, [True] * n, produced
    )


async def test_step_cost_counts_prefill_and_recompute_tokens_not_decode():
    runner = SimulatedRunner({"r0": 3}, step_ms=50, prefill_ms_per_token=0.5)
    # r0 prefills 10 tokens, r1 decodes, r2 recomputes 4 prompt + 2 output tokens
    out = await runner.step(batch([[7] * 10, [7], [7] * 6], [0, 5, 2]))
    assert runner.now_ns == 50_000_000 + 16 * 500_000 and runner.clock() == 0.058
    assert out.token_ids == [runner.token_for("r0", 0), runner.token_for("r1", 5), 5]
    assert runner.token_for("r0", 2) == 2 and runner.token_for("r1", 10_000) != 2  # EOS/none


def test_runner_rejects_negative_costs():
    with pytest.raises(ValueError, match="step_ms"):
        SimulatedRunner(step_ms=-1)


async def test_prefill_cost_makes_recompute_visible():
    workload = [WorkloadRequest(f"r{i}", 0.0, 12, 20) for i in range(3)]
    free = await simulate(workload, "fcfs", SimConfig(kv_blocks=12, block_size=4))
    costly = await simulate(
        workload, "fcfs", SimConfig(kv_blocks=12, block_size=4, prefill_ms_per_token=1.0)
    )
    assert free.preemptions > 0 and costly.preemptions == free.preemptions
    assert costly.runner.prefill_tokens > 3 * 12  # recomputed tokens are paid again
    last = max(s.end_s for s in free.steps)
    assert max(s.end_s for s in costly.steps) == pytest.approx(
        last + costly.runner.prefill_tokens / 1000
    )


def test_workload_file_and_specs(tmp_path):
    path = tmp_path / "w.jsonl"
    rows = [{"id": "x", "arrival_s": 1.5, "prompt_len": 3, "output_len": 4, "length_hint": 9}]
    path.write_text(json.dumps(rows[0]) + "\n\n")
    assert load_jsonl(path) == [WorkloadRequest("x", 1.5, 3, 4, 9)]
    path.write_text(json.dumps(rows[0] | {"output_len": 0}))
    with pytest.raises(ValueError, match="w.jsonl:1"):
        load_jsonl(path)
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[0]))
    with pytest.raises(ValueError, match="repeat"):
        load_jsonl(path)
    assert len(load_workload("article-mix")) == 100
    assert load_workload("poisson:n=50,seed=3") == poisson(n=50, seed=3)
    with pytest.raises(ValueError, match="unknown option"):
        load_workload("poisson:x=1")


def test_poisson_is_bursty_and_deterministic():
    items = poisson(n=400, rate=2.0, burst=5.0, seed=1)
    assert items == poisson(n=400, rate=2.0, burst=5.0, seed=1)
    arrivals = [r.arrival_s for r in items]
    assert arrivals == sorted(arrivals)
    assert len(set(arrivals)) < len(arrivals) / 2  # requests come in bursts
    assert 1.2 < len(items) / arrivals[-1] < 3.3  # about `rate` per second


@pytest.mark.parametrize(("workload", "policy"), [
    ("priority-mix:n=200,rate=9", "priority"),  # admits from behind the head
    ("slo-mix:n=200,rate=6", "edf"),  # preempts: victims go back to the head
])
async def test_the_waiting_views_a_policy_reads_are_the_queue_in_order(workload, policy,
                                                                       monkeypatch):
    """The core keeps the waiting views between steps (remade only as the queue changes):
    at every step they are the waiting queue's requests, in its order."""
    from aioserve.engine.core import EngineCore

    checked = []
    original = EngineCore.snapshot

    def snapshot(core: EngineCore):
        state = original(core)
        checked.append(state.waiting == tuple(core.views[r.request_id] for r in core.waiting))
        return state

    monkeypatch.setattr(EngineCore, "snapshot", snapshot)
    result = await simulate(load_workload(workload), policy,
                            SimConfig(slots=8, kv_blocks=64, step_ms=20))
    assert all(checked) and len(checked) > 200
    assert result.preemptions > 0
