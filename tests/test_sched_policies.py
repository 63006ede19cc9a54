"""The literature's policies as plugins: priority (vLLM), vtc (VTC, OSDI'24), edf
(deadline / goodput-aware) and mlfq (FastServe's skip-join MLFQ), on the simulator's
virtual clock (exact, so no timing is measured here)."""

from __future__ import annotations

import pytest

from aioserve.reports.figures import policy_figures
from aioserve.request import FinishReason, Request, RequestStatus
from aioserve.request_meta import RequestMeta
from aioserve.sampling_params import SamplingParams
from aioserve.scheduling import RequestView, SchedulerState, StepFeedback
from aioserve.scheduling.guard import PolicyGuard
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import slo_mix
from schedulers.edf import EDFScheduler
from schedulers.mlfq import MLFQScheduler
from schedulers.priority import PriorityScheduler
from schedulers.vtc import VTCScheduler

STEP = 0.05  # the simulator's default step, seconds


def running(request_id: str, priority: int, arrival: float) -> Request:
    request = Request(request_id, [5] * 4, SamplingParams(max_tokens=32), arrival)
    request.meta = type(request.meta)(priority=priority)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = 4
    request.block_ids = [0]
    return request


def test_priority_victims_are_the_lowest_priority_then_the_latest():
    reqs = [running("a", 0, 0.0), running("b", 2, 0.1), running("c", 2, 0.2), running("d", 1, 0.3)]
    state = SchedulerState((), tuple(RequestView(r) for r in reqs), 0, 8, 4, 4, 4096, 1.0, 0)
    assert [r.request_id for r in PriorityScheduler().victims(state)] == ["c", "b", "d", "a"]
    guard = PolicyGuard(PriorityScheduler(), lambda: state)  # the engine's mid-step choice
    assert guard.victim([RequestView(r) for r in reqs[::-1]]) == 1


async def test_high_priority_preempts_lower_priority_at_max_num_seqs():
    workload = [WorkloadRequest(f"low{i}", 0.0, 4, 100, meta=RequestMeta(priority=1))
                for i in range(2)]
    workload.append(WorkloadRequest("high", 0.5, 4, 10, meta=RequestMeta(priority=0)))
    fcfs = await simulate(workload, "fcfs", SimConfig(slots=2))
    result = await simulate(workload, PriorityScheduler(), SimConfig(slots=2))
    high = result.finished["high"].metrics
    assert high.first_scheduled_time - high.arrival_time <= STEP  # the next step
    assert fcfs.finished["high"].metrics.first_scheduled_time >= 5.0  # a slot had to free
    assert result.preemptions == 1
    assert all(result.finished[w.id].num_output_tokens == w.output_len for w in workload)


async def test_equal_priorities_keep_arrival_order():
    workload = [WorkloadRequest(f"r{i}", 0.01 * i, 4, 5, meta=RequestMeta(priority=3))
                for i in range(6)]
    result = await simulate(workload, PriorityScheduler(), SimConfig(slots=1))
    starts = [result.finished[f"r{i}"].metrics.first_scheduled_time for i in range(6)]
    assert starts == sorted(starts)


@pytest.mark.parametrize(("low_share", "max_bumps"), [(0.1, 0), (0.1, 8), (0.0, 8)])
async def test_low_priority_gets_its_share_and_the_top_level_bumps_it_boundedly(
        low_share, max_bumps):
    # one slot, a stream of high-priority requests that always has one waiting
    workload = [WorkloadRequest(f"low{i}", 0.0, 4, 4, meta=RequestMeta(priority=5))
                for i in range(3)]
    workload += [WorkloadRequest(f"h{i:03d}", 0.0, 4, 4, meta=RequestMeta(priority=0))
                 for i in range(60)]
    policy = PriorityScheduler(low_share=low_share, max_bumps=max_bumps)
    result = await simulate(workload, policy, SimConfig(slots=1))
    done = sorted(result.finished, key=lambda k: result.finished[k].metrics.finished_time)
    lows = [i for i, k in enumerate(done) if k.startswith("low")]
    if low_share and not max_bumps:  # every 10th contested admission: floor(0.1 * k)
        assert lows == [9, 19, 29] and policy.num_bumped == 0
    elif low_share:  # low0 paid at 9, bumped by the next high one and paid again at 19,
        # 29, then runs (at most max_bumps bumps); the share is of admissions, not service
        assert 1 <= result.finished["low0"].metrics.num_preemptions <= max_bumps
        assert lows[0] == 39 and policy.num_bumped > 0
        assert abs(policy.shared[5] / policy.contested[5] - 0.1) <= 0.01
    else:  # strict priority: after every high one
        assert lows == [60, 61, 62]


def two_tenants(light_too: bool = True) -> list[WorkloadRequest]:
    """A heavy tenant's burst of 60 long requests, a light tenant's 6 spread over it."""
    items = [WorkloadRequest(f"heavy{i:02d}", 0.0, 8, 40, meta=RequestMeta(tenant="heavy"))
             for i in range(60)]
    if light_too:
        items += [WorkloadRequest(f"light{i}", 1.0 + 2.0 * i, 8, 10,
                                  meta=RequestMeta(tenant="light"))
                  for i in range(6)]
    return items


def light_ttft(result) -> float:
    ttfts = [r.metrics.first_token_time - r.arrival_time for k, r in result.finished.items()
             if k.startswith("light")]
    return sum(ttfts) / len(ttfts)


async def test_vtc_keeps_a_light_tenant_fast_under_a_heavy_one():
    config = SimConfig(slots=4)
    alone = await simulate([w for w in two_tenants() if w.meta.tenant == "light"], "fcfs",
                          config)
    vtc = await simulate(two_tenants(), VTCScheduler(), config)
    fcfs = await simulate(two_tenants(), "fcfs", config)
    assert light_ttft(vtc) <= 2 * light_ttft(alone)
    assert light_ttft(fcfs) > 10 * light_ttft(alone)


async def test_vtc_shares_service_fairly_between_backlogged_tenants():
    workload = [WorkloadRequest(f"a{i:02d}", 0.0, 8, 30, meta=RequestMeta(tenant="a"))
                for i in range(40)]
    workload += [WorkloadRequest(f"b{i:02d}", 0.2, 8, 30, meta=RequestMeta(tenant="b"))
                 for i in range(20)]
    vtc = policy_figures(await simulate(workload, VTCScheduler(), SimConfig(slots=4)))
    fcfs = policy_figures(await simulate(workload, "fcfs", SimConfig(slots=4)))
    assert vtc["jain_index"] >= 0.9 > fcfs["jain_index"]


def tenant_request(request_id: str, tenant: str) -> Request:
    request = Request(request_id, [5], SamplingParams(), 0.0)
    request.meta = type(request.meta)(tenant=tenant)
    return request


def test_vtc_lifts_a_tenant_without_waiting_requests_to_the_waiting_minimum():
    policy = VTCScheduler()
    busy = [tenant_request("b1", "busy"), tenant_request("b2", "busy")]
    runs = tenant_request("r1", "runs")  # running, not waiting: it does not count
    policy.counters.update(busy=500.0, runs=100.0)

    def state(*waiting: Request) -> SchedulerState:
        return SchedulerState(tuple(RequestView(r) for r in waiting), (RequestView(runs),),
                              8, 8, 4, 4, 64, 0.0, 0)

    policy.on_arrival(RequestView(busy[1]), state(busy[0], busy[1]))
    assert policy.counters["busy"] == 500.0  # it has another waiting: no lift
    back = tenant_request("r2", "runs")
    policy.on_arrival(RequestView(back), state(busy[0], back))
    assert policy.counters["runs"] == 500.0  # a running request banks no credit
    idle = tenant_request("i1", "idle")
    policy.on_arrival(RequestView(idle), state(idle))
    assert policy.counters.get("idle", 0.0) == 0.0  # nobody waits: nothing to lift to


async def test_edf_serves_the_earliest_due_first():
    workload = [WorkloadRequest(name, 0.0, 4, 5, meta=RequestMeta(ttft_slo_ms=slo))
                for name, slo in (("loose", 5000), ("tight", 300), ("mid", 1000))]
    workload.append(WorkloadRequest("none", 0.0, 4, 5))
    result = await simulate(workload, EDFScheduler(), SimConfig(slots=1))
    order = sorted(result.finished, key=lambda k: result.finished[k].metrics.first_scheduled_time)
    assert order == ["tight", "mid", "loose", "none"]


async def test_edf_sheds_late_requests_when_asked():
    workload = [WorkloadRequest(f"r{i}", 0.0, 4, 20, meta=RequestMeta(ttft_slo_ms=400))
                for i in range(6)]
    result = await simulate(workload, EDFScheduler(shed_late=True), SimConfig(slots=2))
    shed = [r for r in result.finished.values() if r.finish_reason is FinishReason.ERROR]
    served = [r for r in result.finished.values() if r.finish_reason is FinishReason.STOP]
    assert len(shed) == 4 and len(served) == 2
    assert all("cannot meet its objective" in (r.shed_reason or "") for r in shed)
    assert result.core.blocks.num_free_blocks == result.core.blocks.num_blocks


async def test_edf_attains_more_slos_than_fcfs_under_overload():
    # the load at which fcfs meets about half of the objectives (8 slots, 20 ms steps)
    workload = slo_mix(n=200, rate=4.3, tight_ms=300, loose_ms=3000, seed=3)
    config = SimConfig(slots=8, step_ms=20)
    fcfs = policy_figures(await simulate(workload, "fcfs", config))
    edf = policy_figures(await simulate(workload, EDFScheduler(), config))
    assert 0.35 <= fcfs["slo_attainment"] <= 0.65
    assert edf["slo_attainment"] >= fcfs["slo_attainment"] + 0.2


def test_mlfq_skip_join_in_iterations_and_demotion():
    policy = MLFQScheduler(levels=4, quantum=8, prefill_tokens_per_iteration=100)
    state = SchedulerState((), (), 8, 8, 4, 4, 4096, 0.0, 0)
    prompts = {"short": 6, "mid": 800, "long": 1000, "huge": 4000}
    for request_id, tokens in prompts.items():
        request = Request(request_id, [5] * tokens, SamplingParams(), 0.0)
        policy.on_arrival(RequestView(request), state)
    # prefill iterations 1, 8, 10, 40 against quanta 8, 16, 32, 64
    assert policy.level == {"short": 0, "mid": 0, "long": 1, "huge": 3}
    for step in range(8):
        feedback = StepFeedback(step, 0.0, 0.1, ("short",), (1,), (6,), (1,), (True,), ())
        policy.on_step(feedback, state)
    assert policy.level["short"] == 1 and policy.served["short"] == 0


#: lengths seen finishing, so the gain rule expects long jobs to stay long
PRIOR = [4] * 20 + [200] * 20


async def test_mlfq_evicts_for_a_short_job_behind_long_ones():
    # at 2 s the long jobs have 40 tokens: level 2, evict_gap (2) levels below the short one
    workload = [WorkloadRequest(f"long{i}", 0.0, 4, 140) for i in range(2)]
    workload.append(WorkloadRequest("short", 2.0, 4, 4))
    fcfs = await simulate(workload, "fcfs", SimConfig(slots=2))
    mlfq = await simulate(workload, MLFQScheduler(quantum=8, length_prior=PRIOR),
                          SimConfig(slots=2))
    wait = {name: r.finished["short"].metrics.first_scheduled_time - 2.0
            for name, r in (("fcfs", fcfs), ("mlfq", mlfq))}
    assert wait["mlfq"] <= 2 * STEP and wait["fcfs"] >= 3.0
    assert all(mlfq.finished[w.id].num_output_tokens == w.output_len for w in workload)


async def test_mlfq_evicts_only_a_request_evict_gap_levels_worse():
    # at 1 s the long jobs are at level 1 (8 of quantum 8, 16 more to level 2 at 1.2 s)
    workload = [WorkloadRequest(f"long{i}", 0.0, 4, 140) for i in range(2)]
    workload.append(WorkloadRequest("short", 1.0, 4, 4))
    start = {}
    for gap in (1, 2):
        result = await simulate(workload, MLFQScheduler(quantum=8, evict_gap=gap,
                                                              length_prior=PRIOR),
                                SimConfig(slots=2))
        start[gap] = result.finished["short"].metrics.first_scheduled_time
    assert start[1] <= 1.0 + 2 * STEP < 1.2 <= start[2] <= 1.2 + 2 * STEP


async def test_mlfq_evicts_a_request_at_most_max_evictions_times():
    # two long jobs on two slots, a short one arriving every 0.5 s: each short one would
    # evict a long one again; after its one eviction a long job keeps its slot
    workload = [WorkloadRequest(f"long{i}", 0.0, 4, 200) for i in range(2)]
    workload += [WorkloadRequest(f"s{i}", 1.0 + 0.5 * i, 4, 4) for i in range(12)]
    for limit, most in ((1, 1), (3, 3)):
        result = await simulate(workload, MLFQScheduler(quantum=8, max_evictions=limit,
                                                              length_prior=PRIOR),
                                SimConfig(slots=2))
        counts = [result.finished[f"long{i}"].metrics.num_preemptions for i in range(2)]
        assert max(counts) == most, (limit, counts)


async def test_mlfq_evicts_nothing_where_nothing_is_known():
    # the same two long jobs and a short one, without a prior: no eviction, fcfs's order
    workload = [WorkloadRequest(f"long{i}", 0.0, 4, 140) for i in range(2)]
    workload.append(WorkloadRequest("short", 2.0, 4, 4))
    fcfs = await simulate(workload, "fcfs", SimConfig(slots=2))
    mlfq = await simulate(workload, MLFQScheduler(quantum=8), SimConfig(slots=2))
    assert mlfq.preemptions == 0
    assert {k: r.metrics.finished_time for k, r in mlfq.finished.items()} == {
        k: r.metrics.finished_time for k, r in fcfs.finished.items()}


async def test_mlfq_pauses_all_but_its_batch_admissions_included():
    rows: list[int] = []
    workload = [WorkloadRequest(f"r{i}", 0.1 * i, 4, 30) for i in range(6)]
    result = await simulate(workload, MLFQScheduler(batch_size=2), SimConfig(slots=6),
                            on_step=lambda core, f: rows.append(len(f.request_ids)))
    assert max(rows) == 2 and result.preemptions == 0
    assert all(r.num_output_tokens == 30 for r in result.finished.values())


def test_edf_due_time_is_the_next_tokens():
    policy = EDFScheduler(default_ttft_ms=10_000, default_tpot_ms=200)
    request = Request("r", [5] * 4, SamplingParams(), 1.0)
    request.meta = type(request.meta)(ttft_slo_ms=500, tpot_slo_ms=50)
    assert policy.due(RequestView(request)) == 1.5  # the first token
    request.output_token_ids = [7, 7, 7]
    request.metrics.first_token_time, request.metrics.last_token_time = 1.4, 2.0
    assert policy.due(RequestView(request)) == 2.05  # the last token's time + TPOT, not the first's
    plain = Request("p", [5] * 4, SamplingParams(), 1.0)
    assert policy.due(RequestView(plain)) == 11.0  # best effort: the default TTFT ages it
    plain.metrics.first_token_time = plain.metrics.last_token_time = 3.0
    assert policy.due(RequestView(plain)) == 3.2


def test_edf_slack_check_delays_what_cannot_be_on_time():
    policy = EDFScheduler(late_delay_s=5.0)
    policy.step_s = 0.1
    hopeless = Request("h", [5] * 4, SamplingParams(), 0.0)
    hopeless.meta = type(hopeless.meta)(ttft_slo_ms=1050)  # due 1.05, next step ends 1.1
    fresh = Request("f", [5] * 4, SamplingParams(), 1.0)
    fresh.meta = type(fresh.meta)(ttft_slo_ms=3000)
    state = SchedulerState((RequestView(hopeless), RequestView(fresh)), (), 8, 8, 4, 4, 64, 1.0, 0)
    assert policy.late(RequestView(hopeless), state) and not policy.late(RequestView(fresh), state)
    assert [r.request_id for r in policy.order(state)] == ["f", "h"]


def test_edf_holds_late_requests_behind_those_on_time_then_lets_them_back():
    # a late request waits behind one on time until it has waited twice late_delay_s
    # since arrival (the drain time, here 0.1 s, is shorter), then goes back by due time
    policy = EDFScheduler(late_delay_s=5.0)
    policy.step_s = 0.1
    hopeless = Request("h", [5] * 4, SamplingParams(), 0.0)
    hopeless.meta = type(hopeless.meta)(ttft_slo_ms=1050)  # due 1.05: late at 1.0
    fresh = Request("f", [5] * 4, SamplingParams(), 1.0)
    fresh.meta = type(fresh.meta)(ttft_slo_ms=30_000)  # due 31.0
    views = (RequestView(hopeless), RequestView(fresh))
    state = SchedulerState(views, (), 8, 8, 4, 4, 64, 1.0, 0)
    ids = tuple(f"x{i}" for i in range(20))
    policy.on_step(StepFeedback(0, 0.0, 1.0, ids, (1,) * 20, (8,) * 20, (1,) * 20,
                                (True,) * 20, finished=ids), state)
    assert abs(policy.drain_s(state) - 0.1) < 0.01  # 2 waiting at about 20 finishes a second
    assert [r.request_id for r in policy.order(state)] == ["f", "h"]
    later = SchedulerState(views, (), 8, 8, 4, 4, 64, 9.9, 0)  # waited 9.9 s: still held
    assert [r.request_id for r in policy.order(later)] == ["f", "h"]
    later = SchedulerState(views, (), 8, 8, 4, 4, 64, 10.1, 0)  # 10.1 s: back by due time
    assert [r.request_id for r in policy.order(later)] == ["h", "f"]
