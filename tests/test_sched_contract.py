"""The scheduler contract, for every registered policy and the example plugin: after
every step the token budget and slots hold, no request is both waiting and running,
KV blocks balance, and every admissible request finishes with exactly its tokens."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.engine.core import EngineCore
from aioserve.request import FinishReason, RequestStatus
from aioserve.request_meta import RequestMeta
from aioserve.runners.base import ScheduledBatch
from aioserve.scheduling.registry import available_schedulers, load_scheduler
from aioserve.sim.runner import SimulatedRunner
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE_SPEC = "custom_scheduler:FairShareScheduler"
POLICIES = [*available_schedulers(), EXAMPLE_SPEC]
CONFIG = SimConfig(slots=4, kv_blocks=16, block_size=4, max_num_batched_tokens=24)


@pytest.fixture(autouse=True)
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def contract_workload() -> list[WorkloadRequest]:
    """Three tenants, bursts and gaps, prompts that need chunked prefill, outputs that
    outgrow a 16 x 4-token cache, and two requests that can never fit it."""
    rng = random.Random(4)
    items = [
        WorkloadRequest(
            f"{'abc'[i % 3]}-{i}",
            round(rng.choice([0.0, 0.0, 0.3, 1.0, 2.5]) + i * 0.01, 3),
            rng.randint(1, 30),
            rng.randint(1, 30),
        )
        for i in range(24)
    ]
    items.append(WorkloadRequest("c-huge-prompt", 0.2, 70, 1))
    items.append(WorkloadRequest("a-huge-output", 0.2, 10, 60))
    return items


def check_step(core: EngineCore, batch: ScheduledBatch) -> None:
    assert batch.num_tokens <= core.max_num_batched_tokens
    assert len(batch.request_ids) == len(set(batch.request_ids)) <= core.max_num_seqs
    assert len(core.running) <= core.max_num_seqs
    waiting = {r.request_id for r in core.waiting}
    running = {r.request_id for r in core.running}
    assert not waiting & running
    assert all(r.status is RequestStatus.WAITING and not r.block_ids for r in core.waiting)
    assert all(r.status is RequestStatus.RUNNING for r in core.running)
    core.blocks.check_integrity(held=[r.block_ids for r in core.running])


@pytest.mark.parametrize("policy", POLICIES)
async def test_contract_in_simulator(policy):
    workload = contract_workload()
    result = await simulate(workload, policy, CONFIG, on_step=check_step)
    assert set(result.rejected) == {"c-huge-prompt", "a-huge-output"}
    assert "16 blocks" in result.rejected["c-huge-prompt"]
    admissible = [w for w in workload if w.id not in result.rejected]
    assert set(result.finished) == {w.id for w in admissible}
    for item in admissible:
        request = result.finished[item.id]
        expected = [result.runner.token_for(item.id, i) for i in range(item.output_len)]
        assert request.output_token_ids == expected, item.id  # none lost or doubled
        assert request.finish_reason is FinishReason.STOP
    core = result.core
    assert not core.has_work and core.blocks.num_free_blocks == core.blocks.num_blocks
    core.blocks.check_integrity(held=[])
    if policy in ("fcfs", "static"):
        assert result.preemptions > 0  # the workload does put the cache under pressure
    if policy == "memory_aware":
        assert result.preemptions == 0  # exact hints, watermark 1: every admission fits
    assert result.preemptions == sum(r.metrics.num_preemptions for r in result.finished.values())


@pytest.mark.parametrize("policy", POLICIES)
async def test_contract_on_async_engine(policy):
    lengths = {f"{'ab'[i % 2]}-{i}": 3 + (i * 7) % 17 for i in range(10)}
    runner = SimulatedRunner(lengths, num_kv_blocks=12, block_size=4, max_model_len=64)
    config = EngineConfig(model="<simulated>", scheduler=policy, max_num_seqs=3)

    async def one(request_id: str) -> list[int]:
        tokens: list[int] = []
        params = SamplingParams(max_tokens=32, temperature=0.0)
        prompt = [5] * (2 + len(request_id) + lengths[request_id] % 5)
        async for out in engine.generate(prompt, params, request_id):
            tokens += out.token_ids
        return tokens

    async with AsyncEngine(config, runner=runner) as engine:
        outputs = await asyncio.gather(*(one(r) for r in lengths))
        for request_id, tokens in zip(lengths, outputs):
            assert tokens == [runner.token_for(request_id, i) for i in range(lengths[request_id])]
        stats = engine.stats()
        assert stats["num_free_blocks"] == 12 and stats["num_running"] == 0
        assert runner.steps > 0 and runner.now_ns == runner.steps * 50_000_000  # virtual clock
        assert engine.core is not None and engine.core.clock() == runner.clock()


def test_example_loads_through_an_entry_point(tmp_path, monkeypatch):
    dist = tmp_path / "aioserve_example_policy-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: aioserve-example-policy\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(f"[aioserve.schedulers]\nfair_share = {EXAMPLE_SPEC}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "fair_share" in available_schedulers()
    policy = load_scheduler("fair_share")
    assert type(policy).__name__ == "FairShareScheduler" and policy.name == "fair_share"
    assert type(load_scheduler(EXAMPLE_SPEC)) is type(policy)


async def test_fair_share_interleaves_tenants():
    # tenant a floods the queue first; b's single request still gets the second slot
    workload = [WorkloadRequest(f"a-{i}", 0.0, 4, 10, meta=RequestMeta(tenant="a"))
                for i in range(6)]
    workload.append(WorkloadRequest("b-0", 0.0, 4, 10, meta=RequestMeta(tenant="b")))
    fair = await simulate(workload, EXAMPLE_SPEC, SimConfig(slots=2))
    fcfs = await simulate(workload, "fcfs", SimConfig(slots=2))
    assert fair.finished["b-0"].metrics.first_scheduled_time == 0.0
    assert fcfs.finished["b-0"].metrics.first_scheduled_time == 1.5


def test_example_is_about_thirty_lines():
    code = [
        line
        for line in (EXAMPLES / "custom_scheduler.py").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert len(code) <= 45
