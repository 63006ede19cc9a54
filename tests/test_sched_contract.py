"""The scheduler contract 1.0 (docs/schedulers.md): for every registered policy and the
example plugin, after every step the token budget and slots hold, no request is both
waiting and running, KV blocks balance, and every admissible request finishes with exactly
its tokens; then each part of the contract on a policy written for it: read-only views
with metadata, pause, shed, prefill chunks, step feedback, hooks given the snapshot after
their event, the eviction order (``victims``), parameters checked against the constructor,
configuration keyed by policy, and a failing policy contained. What each built-in policy
promises: tests/test_sched_promises.py."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path
from typing import ClassVar

import pytest

from aioserve import AsyncEngine, EngineConfig, RequestShedError, SamplingParams
from aioserve.commands.simulate import policy_params
from aioserve.engine.core import EngineCore
from aioserve.request import FinishReason, Request, RequestStatus
from aioserve.request_meta import RequestMeta
from aioserve.runners.base import ScheduledBatch
from aioserve.scheduling import (
    CONTRACT_VERSION,
    OrderedScheduler,
    RequestView,
    Scheduler,
    SchedulerOutput,
    SchedulerState,
    StepFeedback,
)
from aioserve.scheduling.registry import available_schedulers, load_scheduler, params_by_policy
from aioserve.sim.runner import OverlappedRunner, SimulatedRunner
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


class Recorder(OrderedScheduler):
    """FCFS that keeps what it saw."""

    name: ClassVar[str] = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, RequestView] = {}
        self.steps: list[StepFeedback] = []

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        self.seen[request.request_id] = request

    def on_step(self, feedback: StepFeedback, state: SchedulerState) -> None:
        self.steps.append(feedback)


def test_views_are_read_only():
    request = Request("r", [5, 6, 7], SamplingParams(), 0.0)
    view = RequestView(request)
    for name in ("request_id", "priority", "num_computed_tokens", "block_ids", "tenant"):
        with pytest.raises(AttributeError):
            setattr(view, name, None)
    with pytest.raises(AttributeError):
        view.extra = 1  # type: ignore[attr-defined]
    request.block_ids = [3, 4]
    assert view.block_ids == (3, 4) and view.num_blocks == 2
    assert isinstance(view.prompt_token_ids, tuple)


async def test_metadata_reaches_the_policy():
    policy = Recorder()
    runner = SimulatedRunner({"r": 3}, num_kv_blocks=16, block_size=4, max_model_len=64)
    async with AsyncEngine(EngineConfig(model="<sim>"), runner=runner, scheduler=policy) as e:
        meta = RequestMeta(priority=-3, tenant="acme", ttft_slo_ms=200, tpot_slo_ms=50,
                           deadline=time.time() + 30, metadata={"team": "search"})
        async for _ in e.generate([5, 6, 7], SamplingParams(max_tokens=8), "r", meta=meta):
            pass
    view = policy.seen["r"]
    assert (view.priority, view.tenant, view.ttft_slo_ms, view.tpot_slo_ms) == (
        -3, "acme", 200, 50)
    assert dict(view.metadata) == {"team": "search"}
    # the deadline is on the engine's clock (the simulator's here: it starts at 0)
    assert view.deadline is not None and 29 < view.deadline - view.arrival_time <= 30
    with pytest.raises(TypeError):
        view.metadata["team"] = "ads"  # type: ignore[index]


class Pauser(OrderedScheduler):
    """Pauses one request for the steps it names."""

    name: ClassVar[str] = "pauser"

    def __init__(self, victim: str, steps: set[int]) -> None:
        super().__init__()
        self.victim, self.pause_steps = victim, steps

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        decision = super().schedule(state)
        pause = [self.victim] if state.step in self.pause_steps else []
        return SchedulerOutput(admit=decision.admit, preempt=decision.preempt, pause=pause)


async def test_pause_keeps_the_kv_and_skips_the_step():
    workload = [WorkloadRequest("a", 0.0, 4, 10), WorkloadRequest("b", 0.0, 4, 10)]
    rows: list[tuple[str, ...]] = []
    blocks: list[int] = []

    def watch(core, feedback):
        rows.append(feedback.request_ids)
        blocks.append(sum(r.num_blocks for r in core.running))

    result = await simulate(workload, Pauser("b", {3, 4, 5}), SimConfig(slots=2), on_step=watch)
    assert [("b" in r) for r in rows[2:7]] == [True, False, False, False, True]
    assert result.finished["b"].num_output_tokens == 10
    assert result.preemptions == 0 and result.finished["b"].metrics.finished_time > (
        result.finished["a"].metrics.finished_time)


async def test_pausing_everything_never_stalls_the_engine():
    class PauseAll(OrderedScheduler):
        name: ClassVar[str] = "pause_all"

        def schedule(self, state):
            decision = super().schedule(state)
            return SchedulerOutput(admit=decision.admit,
                                   pause=[r.request_id for r in state.running])

    result = await simulate([WorkloadRequest("a", 0.0, 4, 6)], PauseAll(), SimConfig(slots=1))
    assert result.finished["a"].num_output_tokens == 6


class Shedder(OrderedScheduler):
    name: ClassVar[str] = "shedder"

    def schedule(self, state):
        shed = {r.request_id: "over quota" for r in state.waiting if r.tenant == "blocked"}
        decision = super().schedule(state)
        return SchedulerOutput(admit=[a for a in decision.admit if a not in shed], shed=shed)


async def test_shed_ends_the_request_with_its_reason_and_frees_everything():
    runner = SimulatedRunner(num_kv_blocks=16, block_size=4, max_model_len=64)
    async with AsyncEngine(EngineConfig(model="<sim>"), runner=runner, scheduler=Shedder()) as e:
        params = SamplingParams(max_tokens=5, temperature=0)
        with pytest.raises(RequestShedError, match="over quota"):
            async for _ in e.generate([5, 6], params, "x", meta=RequestMeta(tenant="blocked")):
                pass
        tokens = [t async for out in e.generate([5, 6], params, "y") for t in out.token_ids]
        assert len(tokens) == 5
        stats = e.stats()
        assert stats["num_free_blocks"] == 16 and stats["num_running"] == 0
        assert e.core is not None and e.core.num_shed == 1


async def test_prefill_chunk_limits_a_requests_tokens_per_step():
    class Chunked(OrderedScheduler):
        name: ClassVar[str] = "chunked"

        def schedule(self, state):
            decision = super().schedule(state)
            return SchedulerOutput(admit=decision.admit, prefill_chunk={"long": 8})

    rows: list[dict[str, int]] = []
    workload = [WorkloadRequest("long", 0.0, 30, 3), WorkloadRequest("short", 0.0, 5, 3)]
    await simulate(workload, Chunked(), SimConfig(slots=2),
                   on_step=lambda core, f: rows.append(
                       dict(zip(f.request_ids, f.num_computed_tokens))))
    assert [r["long"] for r in rows[:4]] == [8, 8, 8, 6]  # 30 prompt tokens in chunks of 8
    assert rows[0]["short"] == 5


async def test_step_feedback_accounts_for_every_token():
    policy = Recorder()
    workload = [WorkloadRequest(f"r{i}", 0.1 * i, 4 + i, 5 + i) for i in range(4)]
    result = await simulate(workload, policy, SimConfig(slots=2, step_ms=10))
    emitted: dict[str, int] = {}
    for step in policy.steps:
        assert step.duration_s == pytest.approx(0.01)
        for request_id, n in step.emitted().items():
            emitted[request_id] = emitted.get(request_id, 0) + n
    assert emitted == {k: r.num_output_tokens for k, r in result.finished.items()}
    assert [s.step for s in policy.steps] == list(range(len(policy.steps)))


class Broken(Scheduler):
    name: ClassVar[str] = "broken"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def schedule(self, state):
        if self.mode == "raise":
            raise RuntimeError("policy bug")
        return SchedulerOutput(admit=None)  # type: ignore[arg-type]

    def on_arrival(self, request, state):
        raise KeyError("hook bug")


@pytest.mark.parametrize("mode", ["raise", "malformed"])
async def test_a_failing_policy_is_contained_and_says_so(mode, caplog):
    workload = [WorkloadRequest(f"r{i}", 0.05 * i, 4, 6) for i in range(5)]
    with caplog.at_level(logging.ERROR):
        result = await simulate(workload, Broken(mode), SimConfig(slots=2))
    assert all(r.num_output_tokens == 6 for r in result.finished.values())
    assert len(result.finished) == 5 and result.core.guard.failures >= 10
    assert "FCFS decision" in caplog.text and "on_arrival" in caplog.text
    assert caplog.text.count("Traceback") <= 2  # the traceback once per method


def test_parameters_are_checked_against_the_constructor():
    assert load_scheduler("spf", {"max_wait_s": 5}).max_wait_s == 5  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="no parameter 'max_wait'.*max_wait_s"):
        load_scheduler("spf", {"max_wait": 5})
    with pytest.raises(ValueError, match="'max_wait_s'.*valid number"):
        load_scheduler("spf", {"max_wait_s": "soon"})
    with pytest.raises(ValueError, match="watermark must be in"):
        load_scheduler("fcfs", {"watermark": 2})
    with pytest.raises(ValueError, match="'nowhere': not one of hint, cap, oracle, learned"):
        load_scheduler("spf", {"predictor": "nowhere"})
    with pytest.raises(ValueError, match="not of the form"):
        load_scheduler("spf", {"predictor": "nowhere:"})


async def test_the_simulator_schedules_as_the_engine_does():
    """One step ahead: the simulator and an AsyncEngine over the same overlapped runner
    give every request the same first-token and finish times (virtual clock)."""
    lengths = {f"r{i}": 3 + (i * 5) % 11 for i in range(8)}
    workload = [WorkloadRequest(k, 0.0, 4 + i, n) for i, (k, n) in enumerate(lengths.items())]
    config = SimConfig(slots=3, kv_blocks=12, block_size=4, overlap=True, step_ms=10)
    sim = await simulate(workload, "fcfs", config)
    runner = OverlappedRunner({}, step_ms=10, num_kv_blocks=12, block_size=4,
                              max_model_len=sim.core.max_model_len)
    engine_config = EngineConfig(model="<sim>", max_num_seqs=3, enable_prefix_caching=False)
    times = {}
    async with AsyncEngine(engine_config, runner=runner) as engine:
        # the simulator's hidden stop (max_tokens a cap), as the engine's stop_after
        streams = [engine.add_request(
            w.prompt_token_ids(512, 3),
            SamplingParams(max_tokens=w.cap(sim.core.max_model_len), temperature=0,
                           ignore_eos=True), w.id, stop_after=w.output_len)
            for w in workload]
        for stream in streams:
            while not (await stream.queue.get()).finished:
                pass
            m = stream.request.metrics
            times[stream.request.request_id] = (m.first_token_time, m.finished_time)
    assert times == {k: (r.metrics.first_token_time, r.metrics.finished_time)
                     for k, r in sim.finished.items()}
    assert sim.preemptions == engine.core.num_preemptions > 0


class Witness(OrderedScheduler):
    """FCFS that writes down each hook with what its state showed."""

    name: ClassVar[str] = "witness"

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, str, bool]] = []

    def _saw(self, hook: str, request: RequestView, state: SchedulerState) -> None:
        waiting = any(r.request_id == request.request_id for r in state.waiting)
        self.events.append((hook, request.request_id, request.status, waiting))

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        self._saw("arrival", request, state)

    def on_preempt(self, request: RequestView, state: SchedulerState) -> None:
        self._saw("preempt", request, state)

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        self._saw("finish", request, state)

    def on_step(self, feedback: StepFeedback, state: SchedulerState) -> None:
        assert state.step == feedback.step + 1  # the snapshot after the step


def memory_bound() -> list[WorkloadRequest]:
    return [WorkloadRequest(f"r{i}", 0.0, 40, 60) for i in range(6)]


async def test_hooks_see_the_snapshot_after_their_event_and_preemption_is_reported():
    policy = Witness()
    result = await simulate(memory_bound(), policy, SimConfig(slots=6, kv_blocks=24))
    assert result.core.guard.failures == 0
    preempts = [e for e in policy.events if e[0] == "preempt"]
    assert len(preempts) == result.preemptions > 0
    assert all(status == "waiting" and waiting for _, _, status, waiting in preempts)
    arrivals = [e for e in policy.events if e[0] == "arrival"]
    assert len(arrivals) == 6 and all(waiting for *_, waiting in arrivals)
    finishes = [e for e in policy.events if e[0] == "finish"]
    assert len(finishes) == 6 and not any(waiting for *_, waiting in finishes)


def test_config_keyed_by_spec_or_name():
    names = ["fcfs", "schedulers.vtc:VTCScheduler"]
    keyed = policy_params('{"vtc": {"preempt": false}}', names)
    assert keyed == {"fcfs": None, "schedulers.vtc:VTCScheduler": {"preempt": False}}
    shared = policy_params('{"watermark": 0.05}', names)
    assert shared == dict.fromkeys(names, {"watermark": 0.05})


def test_config_keyed_by_the_one_policy_of_a_command():
    assert params_by_policy(["vtc"], {"vtc": {"preempt": False}}) == {"vtc": {"preempt": False}}
    weights = {"weights": {"a": 3}}  # a parameter whose value is an object
    assert params_by_policy(["vtc"], weights) == {"vtc": weights}
    with pytest.raises(ValueError, match=r"'fcfs' has no parameter 'weights', and one object "
                       r"applies to every policy of this run \(fcfs, vtc\); key it by policy: "
                       r'\{"vtc": \{"weights": \{"a": 3\}\}\}'):
        params_by_policy(["fcfs", "vtc"], weights)  # fcfs refused it later, unexplained
    assert params_by_policy(["fcfs", "vtc"], {"watermark": 0.02}) == {
        "fcfs": {"watermark": 0.02}, "vtc": {"watermark": 0.02}}


def test_config_key_that_names_no_policy_says_which_exist():
    with pytest.raises(ValueError, match=r"'vtcc'.*fcfs, vtc"):
        policy_params('{"vtcc": {"preempt": false}}', ["fcfs", "vtc"])


class OldestFirst(OrderedScheduler):
    """Admits only (the engine must evict); its victims: oldest first, or a bug."""

    name: ClassVar[str] = "oldest_first"

    def __init__(self, broken: bool = False) -> None:
        super().__init__(watermark=0.0)
        self.broken, self.asked = broken, 0

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        return SchedulerOutput(admit=state.admission().fill(state.waiting))

    def victims(self, state):
        self.asked += 1
        if self.broken:
            raise RuntimeError("policy bug")
        return list(state.running)


class NewestFirst(OldestFirst):
    victims = OrderedScheduler.victims  # the default order: the engine does not ask


def eviction_workload() -> list[WorkloadRequest]:
    # the oldest request needs a block while newer ones are not scheduled yet
    return [WorkloadRequest(f"r{i}", 0.0, 1 + i, 12) for i in range(3)]


def preempted(result) -> dict[str, int]:
    return {k: r.metrics.num_preemptions for k, r in result.finished.items()}


async def test_the_engine_evicts_by_the_policys_victims():
    assert CONTRACT_VERSION == "1.0"
    config = SimConfig(slots=3, kv_blocks=5, block_size=4)
    default = await simulate(eviction_workload(), NewestFirst(), config)
    policy = OldestFirst()
    chosen = await simulate(eviction_workload(), policy, config)
    assert policy.asked > 0 and chosen.preemptions > 0 and chosen.core.guard.failures == 0
    assert preempted(chosen) != preempted(default)  # its order, not the engine's newest
    assert all(r.num_output_tokens == 12 for r in chosen.finished.values())


async def test_a_failing_victims_is_contained_and_the_newest_goes():
    config = SimConfig(slots=3, kv_blocks=5, block_size=4)
    default = await simulate(eviction_workload(), NewestFirst(), config)
    broken = OldestFirst(broken=True)
    result = await simulate(eviction_workload(), broken, config)
    assert result.core.guard.failures >= 1 and broken.asked > 0
    assert preempted(result) == preempted(default)


class NotAPolicy:
    name: ClassVar[str] = "not_a_policy"

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        return SchedulerOutput()


def test_a_policy_is_a_scheduler_subclass():
    with pytest.raises(ValueError, match="is not a Scheduler"):
        load_scheduler(NotAPolicy())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'test_sched_contract:NotAPolicy' is not a Scheduler"):
        load_scheduler("test_sched_contract:NotAPolicy")
