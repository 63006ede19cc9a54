"""Contract v2: read-only views with metadata, pause, shed, prefill chunks, step
feedback, the policy's victim, parameters, and a failing policy contained."""

from __future__ import annotations

import logging
import time
from typing import ClassVar

import pytest

from aioserve import AsyncEngine, EngineConfig, RequestMeta, RequestShedError, SamplingParams
from aioserve.request import Request
from aioserve.scheduling import (
    OrderedScheduler,
    RequestView,
    Scheduler,
    SchedulerOutput,
    SchedulerState,
    StepFeedback,
)
from aioserve.scheduling.registry import load_scheduler
from aioserve.sim.runner import OverlappedRunner, SimulatedRunner
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest


class Recorder(OrderedScheduler):
    """FCFS that keeps what it saw."""

    name: ClassVar[str] = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, RequestView] = {}
        self.steps: list[StepFeedback] = []

    def on_arrival(self, request: RequestView) -> None:
        self.seen[request.request_id] = request

    def on_step(self, feedback: StepFeedback) -> None:
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


class OldestVictim(OrderedScheduler):
    """Names the oldest candidate ("oldest"), leaves it to the engine ("default"), or
    names a request that is no candidate ("bad")."""

    name: ClassVar[str] = "oldest_victim"

    def __init__(self, mode: str = "oldest") -> None:
        super().__init__(watermark=0.0)
        self.mode, self.asked = mode, 0

    def schedule(self, state):  # admits only, never preempts: the engine must ask
        return SchedulerOutput(admit=state.admission().fill(state.waiting))

    def choose_victim(self, requester, candidates):
        self.asked += 1
        return {"oldest": candidates[-1].request_id, "default": None, "bad": "nobody"}[
            self.mode]


async def test_the_engine_asks_the_policy_for_its_victim():
    # the oldest request needs a block while newer ones are not scheduled yet
    workload = [WorkloadRequest(f"r{i}", 0.0, 1 + i, 12) for i in range(3)]
    config = SimConfig(slots=3, kv_blocks=5, block_size=4)
    default = await simulate(workload, OldestVictim("default"), config)
    policy = OldestVictim()
    chosen = await simulate(workload, policy, config)
    assert policy.asked > 0 and chosen.preemptions > 0
    def preempted(result):
        return {k: r.metrics.num_preemptions for k, r in result.finished.items()}

    assert preempted(chosen) != preempted(default)  # its choice, not the engine's newest
    assert all(r.num_output_tokens == 12 for r in chosen.finished.values())
    bad = OldestVictim("bad")
    result = await simulate(workload, bad, config)
    assert result.core.guard.failures == bad.asked > 0  # a bad answer: the default
    assert preempted(result) == preempted(default)


class Broken(Scheduler):
    name: ClassVar[str] = "broken"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def schedule(self, state):
        if self.mode == "raise":
            raise RuntimeError("policy bug")
        return SchedulerOutput(admit=None)  # type: ignore[arg-type]

    def on_arrival(self, request):
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
