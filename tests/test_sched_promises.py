"""Each literature policy keeps its paper's promise under sustained overload, on the
simulator's virtual clock (exact and deterministic: fixed seeds, no timing measured).

"Capacity" is the sustained rate at which fcfs's queue stays bounded in the setting
used: fcfs's throughput once saturated (requests finished over the makespan of a run
well above it), measured with ``aioserve simulate --compare`` and written at each test.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

import pytest

from aioserve.reports.figures import outcomes, policy_figures
from aioserve.reports.slo import meets_slo
from aioserve.request import FinishReason
from aioserve.request_meta import RequestMeta
from aioserve.scheduling import StepFeedback
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import heavy_tail, priority_mix, slo_mix
from schedulers.edf import EDFScheduler
from schedulers.mlfq import MLFQScheduler
from schedulers.priority import PriorityScheduler
from schedulers.vtc import VTCScheduler

#: 8 slots, 64 KV blocks of 16 tokens, 20 ms steps (the issue's setting)
CONFIG = SimConfig(slots=8, kv_blocks=64, step_ms=20)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


# -- vtc -------------------------------------------------------------------------------

def flood() -> list[WorkloadRequest]:
    """Tenant heavy alone at 2x capacity: 12.5 req/s of 64-token outputs, where 8 slots
    of 20 ms steps finish 6.2 req/s (fcfs's throughput on heavy's stream alone); tenant light sends
    bursts of 10 every 4 s, so both are often backlogged together. 600 requests, 40 s:
    more than 10x the 1.3 s a request runs (VTC has no aging window)."""
    items = [WorkloadRequest(f"h{i:03d}", round(i * 0.08, 6), 32, 64,
                             meta=RequestMeta(tenant="heavy"))
             for i in range(500)]
    items += [WorkloadRequest(f"l{i:03d}", round(0.5 + 4 * (i // 10), 6), 32, 64,
                              meta=RequestMeta(tenant="light")) for i in range(100)]
    return items


async def test_vtc_service_gap_between_backlogged_tenants_stays_within_theorem_4_4():
    # Sheng et al., Theorem 4.4: over any interval in which two tenants are both
    # backlogged, their (weighted) services differ by at most 2U, U = max(w_p * L_input,
    # w_q * M), M the tokens the KV cache holds. Checked after every step.
    policy = VTCScheduler()
    tenant = {w.id: w.meta.tenant for w in flood()}
    prompt = {w.id: w.prompt_len for w in flood()}
    bound = 2 * max(1 * 32, 2 * 64 * 16)
    service: dict[str | None, float] = defaultdict(float)
    seen: set[str] = set()
    span: list[float] = []  # service gap since both became backlogged: its max - min
    widest = 0.0
    both_steps = 0

    def check(core, feedback: StepFeedback) -> None:
        nonlocal widest, both_steps
        for request_id, emitted in zip(feedback.request_ids, feedback.num_emitted_tokens):
            if request_id not in seen:  # the prompt, once (recomputation is not service)
                seen.add(request_id)
                service[tenant[request_id]] += prompt[request_id]
            service[tenant[request_id]] += 2 * emitted
        backlogged = {r.meta.tenant for r in core.waiting}
        if {"heavy", "light"} <= backlogged:
            both_steps += 1
            gap = service["heavy"] - service["light"]
            span[:] = [min(span[0], gap), max(span[1], gap)] if span else [gap, gap]
            widest = max(widest, span[1] - span[0])
        else:
            span.clear()

    result = await simulate(flood(), policy, CONFIG, on_step=check)
    assert both_steps > 500  # both backlogged for a good part of the run
    assert widest <= bound
    assert len(result.finished) == 600


async def test_vtc_weights_split_backlogged_service():
    # both tenants always backlogged: light (weight 3) gets 3x heavy's service
    workload = [WorkloadRequest(f"{t}{i:03d}", 0.0, 32, 64, meta=RequestMeta(tenant=t))
                for t in ("heavy", "light") for i in range(150)]
    policy = VTCScheduler(weights={"light": 3, "heavy": 1})
    got: dict[str, float] = defaultdict(float)
    tenant = {w.id: w.meta.tenant for w in workload}

    def count(core, feedback: StepFeedback) -> None:
        if {"heavy", "light"} <= {r.meta.tenant for r in core.waiting}:
            for request_id, emitted in zip(feedback.request_ids, feedback.num_emitted_tokens):
                got[tenant[request_id]] += 2 * emitted

    await simulate(workload, policy, CONFIG, on_step=count)
    assert abs(got["light"] / got["heavy"] - 3) <= 0.15  # within 5% of 3:1


async def test_vtc_banks_no_credit_for_a_long_running_request():
    # The scenario: tenant a runs one 1,500-token request while b floods (2x
    # capacity), then a sends 60 requests at t=20 s. Under the paper's lift (waiting
    # queue) the requests first served in [20, 30) s split about evenly; counting
    # running requests as backlog let a bank 20 s of credit and take all of them.
    workload = [WorkloadRequest("a-long", 0.0, 8, 1500, meta=RequestMeta(tenant="a"))]
    workload += [WorkloadRequest(f"b{i:03d}", round(i / 8, 6), 8, 100,
                                 meta=RequestMeta(tenant="b"))
                 for i in range(320)]
    workload += [WorkloadRequest(f"a{i:02d}", 20.0, 8, 100, meta=RequestMeta(tenant="a"))
                 for i in range(60)]
    result = await simulate(workload, VTCScheduler(), SimConfig(slots=8, kv_blocks=256,
                                                               step_ms=20))
    first = [k for k, r in result.finished.items()
             if 20.0 <= r.metrics.first_scheduled_time < 30.0 and k != "a-long"]
    a_share = sum(k.startswith("a") for k in first) / len(first)
    assert len(first) >= 30 and 0.35 <= a_share <= 0.65


async def test_vtc_does_not_charge_recomputation():
    policy = VTCScheduler()
    workload = [WorkloadRequest(f"a{i}", 0.0, 40, 60, meta=RequestMeta(tenant="a"))
                for i in range(6)]
    result = await simulate(workload, policy, SimConfig(slots=6, kv_blocks=24))
    assert result.preemptions > 0  # memory pressure made it recompute
    served = sum(w.prompt_len + 2 * w.output_len for w in workload)
    assert policy.counters["a"] == served


async def test_vtc_lifts_a_tenant_bursting_into_an_empty_queue():
    # Algorithm 2's other lift: tenant a sends 2 req/s (a third of capacity) for 60 s, so
    # its counter grows while the queue is mostly empty; at 40 s tenant b bursts 200
    # requests into that empty queue. Lifted to the last-departed tenant's counter (a's), b
    # shares from the start; left at 0 it took every admission until it caught up
    # (measured: a's mean TTFT 8.6 s, p99 12.1 s, against fcfs 24.2 s and 31.0 s).
    workload = [WorkloadRequest(f"a{i:03d}", round(i / 2, 6), 32, 64,
                                meta=RequestMeta(tenant="a")) for i in range(120)]
    workload += [WorkloadRequest(f"b{i:03d}", 40.01, 32, 64, meta=RequestMeta(tenant="b"))
                 for i in range(200)]

    def a_ttfts(result) -> list[float]:
        return sorted(r.metrics.first_token_time - r.arrival_time
                      for r in result.finished.values()
                      if r.meta.tenant == "a" and r.arrival_time >= 40)

    fcfs = a_ttfts(await simulate(workload, "fcfs", CONFIG))
    for policy in (VTCScheduler(), VTCScheduler(preempt=False)):
        vtc = a_ttfts(await simulate(workload, policy, CONFIG))
        assert len(vtc) == len(fcfs) == 40
        assert mean(vtc) <= 0.1 * mean(fcfs)
        assert vtc[int(0.99 * 39)] <= 0.25 * fcfs[int(0.99 * 39)]


# -- priority ----------------------------------------------------------------------------

def first_token_waits(result, priority: int) -> list[float]:
    return [r.metrics.first_token_time - r.arrival_time for r in result.finished.values()
            if r.meta.priority == priority]


async def test_priority_keeps_high_fast_and_gives_low_its_share_under_sustained_overload():
    # priority-mix (outputs 16-128): fcfs finishes 5.6 req/s saturated, so rate 7 is
    # 1.25x capacity; 1,500 requests are 214 s of overload, more than 10x any wait the
    # old aging (10 s) allowed.
    idle = await simulate(priority_mix(n=300, rate=1), PriorityScheduler(), CONFIG)
    contested: list[bool] = []  # per first admission: did the high class wait then?
    admitted: set[str] = set()
    waited = [False]

    def watch(core, feedback: StepFeedback) -> None:
        for r in core.running:
            if r.request_id not in admitted:
                admitted.add(r.request_id)
                if waited[0]:
                    contested.append(r.meta.priority == 1)
        classes = {r.meta.priority for r in core.waiting}
        waited[0] = classes == {0, 1}

    policy = PriorityScheduler(low_share=0.1)
    loaded = await simulate(priority_mix(n=1500, rate=7), policy, CONFIG, on_step=watch)
    high_idle = mean(first_token_waits(idle, 0))
    high = mean(first_token_waits(loaded, 0))
    assert high <= 2 * high_idle  # measured 0.045 s against 0.024 s idle
    assert mean(first_token_waits(loaded, 1)) > 10 * high  # the overload is real
    # the share is of the admissions level 1 contested: room its oldest could have had
    # (18, 1 paid), not the room level 0 took from level 1's own work (142 first
    # admissions while both waited, 2.8% of them level 1's)
    assert policy.contested[1] > 10
    assert policy.shared[1] == int(0.1 * policy.contested[1])
    assert len(contested) > 50


def three_levels(n: int, rate: float) -> list[WorkloadRequest]:
    """priority-mix's lengths and arrivals, with levels 0, 1, 2 drawn 40/30/30%."""
    rng = random.Random(7)
    return [replace(w, meta=RequestMeta(priority=rng.choices((0, 1, 2), (0.4, 0.3, 0.3))[0]))
            for w in priority_mix(n=n, rate=rate)]


async def test_priority_takes_each_share_from_the_lowest_levels_and_keeps_the_order():
    # Three levels at 1.3x capacity (7.3 req/s, fcfs finishing 5.6 saturated), shares
    # configured per level. The old single share went to the oldest lower request, the
    # next level's mostly: level 1's mean TTFT went from 8.6 s (strict) to 49 s.
    workload = three_levels(1200, 7.3)
    strict = await simulate(workload, PriorityScheduler(low_share=0), CONFIG)
    policy = PriorityScheduler(shares={"1": 0.15, "2": 0.05})
    shared = await simulate(workload, policy, CONFIG)
    for level, share in ((1, 0.15), (2, 0.05)):
        assert policy.contested[level] > 100
        assert abs(policy.shared[level] / policy.contested[level] - share) <= 0.01
    ttft = [mean(first_token_waits(shared, level)) for level in (0, 1, 2)]
    assert ttft[0] < ttft[1] < ttft[2]  # the order of the classes is kept
    assert ttft[1] <= 2 * mean(first_token_waits(strict, 1))
    assert ttft[0] <= 3 * mean(first_token_waits(strict, 0))


@pytest.mark.parametrize("burst", [2.0, 1.0])
async def test_priority_shares_cost_the_top_level_nothing(burst):
    # Same setting, bursty (priority-mix's arrivals) and Poisson. Paying a share took a
    # slot level 0 would have had, and share requests were never preempted: level 0 at
    # 1.9x (bursts) and 3.2x (Poisson) its TTFT under strict priority. Now the shares
    # come from room below the paid level, and only level 0 may preempt (bump) them.
    def levels(n: int, rate: float) -> list[WorkloadRequest]:
        rng = random.Random(7)
        return [replace(w, meta=RequestMeta(priority=rng.choices((0, 1, 2),
                                                                 (0.4, 0.3, 0.3))[0]))
                for w in priority_mix(n=n, rate=rate, burst=burst)]

    workload = levels(1200, 7.3)
    strict = await simulate(workload, PriorityScheduler(low_share=0), CONFIG)
    policy = PriorityScheduler(shares={"1": 0.15, "2": 0.05})
    shared = await simulate(workload, policy, CONFIG)
    for level, share in ((1, 0.15), (2, 0.05)):  # floor(share * k) after k, within one
        assert policy.contested[level] > 50
        assert share * policy.contested[level] - 2 <= policy.shared[level]
        assert policy.shared[level] <= share * policy.contested[level]
    top = mean(first_token_waits(shared, 0))
    assert top <= 1.1 * mean(first_token_waits(strict, 0))
    if burst == 1:  # the floor; level 0 alone on the bursts waits 6.3x idle
        idle = await simulate(levels(300, 1), PriorityScheduler(), CONFIG)
        assert top <= 2 * mean(first_token_waits(idle, 0))
    assert policy.num_bumped > 0


def test_priority_shares_are_checked():
    with pytest.raises(ValueError, match="shares must sum to less than 1"):
        PriorityScheduler(shares={1: 0.6, 2: 0.4})
    with pytest.raises(ValueError, match="level 'low' is not an integer"):
        PriorityScheduler(shares={"low": 0.1})
    with pytest.raises(ValueError, match=r"shares\[2\] must be in \[0, 1\)"):
        PriorityScheduler(shares={2: -0.1})
    with pytest.raises(ValueError, match="share_lag must be an integer >= 0"):
        PriorityScheduler(share_lag=-1)
    with pytest.raises(ValueError, match="max_bumps must be an integer >= 0"):
        PriorityScheduler(max_bumps=-1)
    with pytest.raises(ValueError, match="top_level must be an integer"):
        PriorityScheduler(top_level=0.5)  # type: ignore[arg-type]


# -- edf ---------------------------------------------------------------------------------

async def test_edf_beats_fcfs_on_slo_mix_without_starving_or_slowing_tokens():
    # slo-mix at 4 req/s: the rate at which fcfs attains about half of the objectives
    # (61%). fcfs finishes 4.07 req/s saturated (n=600 at 8 req/s), so this is about
    # capacity, its bursts overloading it, for 150 s (30x edf's late_delay_s).
    workload = slo_mix(n=600, rate=4.0)
    fcfs = policy_figures(await simulate(workload, "fcfs", CONFIG))
    edf = policy_figures(await simulate(workload, EDFScheduler(), CONFIG))
    assert 0.4 <= fcfs["slo_attainment"] <= 0.7
    assert edf["slo_attainment"] >= fcfs["slo_attainment"] + 0.2
    assert edf["mean_tpot_s"] <= 1.5 * fcfs["mean_tpot_s"]
    assert edf["max_wait_s"] <= 2.5 * fcfs["max_wait_s"]  # measured 2.03x


async def test_edf_under_sustained_overload_keeps_tokens_and_waits_bounded():
    # 5 req/s: 1.23x capacity for 120 s. Without shedding no policy meets much: edf
    # still gains, keeps fcfs's TPOT and its longest wait; shedding the late restores
    # goodput.
    workload = slo_mix(n=600, rate=5.0)
    fcfs = policy_figures(await simulate(workload, "fcfs", CONFIG))
    edf = policy_figures(await simulate(workload, EDFScheduler(), CONFIG))
    shedding = policy_figures(await simulate(workload, EDFScheduler(shed_late=True), CONFIG))
    assert edf["slo_attainment"] >= fcfs["slo_attainment"] + 0.1
    assert edf["mean_tpot_s"] <= 1.5 * fcfs["mean_tpot_s"]
    assert edf["max_wait_s"] <= 2.5 * fcfs["max_wait_s"]  # measured 2.03x
    assert shedding["slo_attainment"] >= fcfs["slo_attainment"] + 0.5


def independent_mix(n: int, rate: float, seed: int = 0) -> list[WorkloadRequest]:
    """Objectives independent of output length: half TTFT 300 ms + TPOT 50 ms, half only
    a deadline (the finish time) 15 s after arrival; prompts 16-128, outputs 8-192."""
    rng = random.Random(seed)
    items, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        prompt, output = rng.randint(16, 128), rng.randint(8, 192)
        if rng.random() < 0.5:
            items.append(WorkloadRequest(f"o{i:04d}", round(t, 6), prompt, output,
                                         meta=RequestMeta(ttft_slo_ms=300, tpot_slo_ms=50)))
        else:
            items.append(WorkloadRequest(f"d{i:04d}", round(t, 6), prompt, output,
                                         deadline_s=round(t + 15, 6)))
    return items


@pytest.mark.parametrize("rate", [3.5, 3.7])
async def test_edf_reads_the_deadline_as_the_finish_time(rate):
    # 3.5 req/s: fcfs attains 56.5% (the deadline half 100%, the tight half 14%), 3.7:
    # 49%. As the finish time less the predicted work left, with late requests held
    # behind those on time until they have waited twice the queue's drain time, edf
    # gains 15 points at both (the deadline half within 3.4 of fcfs's). Held from the
    # missed due time instead, they came back ahead of the deadline half: at 3.7 edf
    # gained 6.7 points and the deadline half fell 16 below fcfs's.
    workload = independent_mix(600, rate)
    items = {w.id: w for w in workload}

    def attained(result, prefix: str) -> float:
        by_id = {o.id: o for o in outcomes(result)}
        ids = [k for k in items if k.startswith(prefix)]
        return sum(meets_slo(by_id[k]) for k in ids) / len(ids)

    fcfs_run = await simulate(workload, "fcfs", CONFIG)
    edf_run = await simulate(workload, EDFScheduler(), CONFIG)
    shed_run = await simulate(workload, EDFScheduler(shed_late=True), CONFIG)
    fcfs, edf, shedding = (policy_figures(r) for r in (fcfs_run, edf_run, shed_run))
    assert 0.4 <= fcfs["slo_attainment"] <= 0.6
    assert edf["slo_attainment"] >= fcfs["slo_attainment"] + 0.1
    assert shedding["slo_attainment"] >= fcfs["slo_attainment"] + 0.2
    assert attained(shed_run, "d") >= attained(fcfs_run, "d")
    assert attained(edf_run, "d") >= attained(fcfs_run, "d") - 0.05
    assert edf["mean_tpot_s"] <= 1.5 * fcfs["mean_tpot_s"]
    shed = [r for r in shed_run.finished.values() if r.finish_reason is FinishReason.ERROR]
    assert all(r.num_output_tokens == 0 for r in shed)


async def test_edf_leaves_room_for_a_deadline_request_longer_than_predicted():
    # 3.6 req/s, seed 0: fcfs meets every deadline-only request. Trusting the predicted
    # work left exactly, edf started two of them too late (outputs up to 192 tokens
    # against a learned mean near 100) and met 99.3%; with deadline_margin 1.5, 100%.
    workload = independent_mix(600, 3.6)
    ids = [w.id for w in workload if w.id.startswith("d")]

    def deadline_half(result) -> float:
        by_id = {o.id: o for o in outcomes(result)}
        return sum(meets_slo(by_id[k]) for k in ids) / len(ids)

    fcfs = deadline_half(await simulate(workload, "fcfs", CONFIG))
    assert fcfs == 1.0
    assert deadline_half(await simulate(workload, EDFScheduler(), CONFIG)) >= fcfs
    exact = deadline_half(await simulate(workload, EDFScheduler(deadline_margin=1), CONFIG))
    assert exact < fcfs


async def test_edf_sheds_no_request_that_has_streamed():
    workload = slo_mix(n=600, rate=5.0, tpot_ms=60)
    result = await simulate(workload, EDFScheduler(shed_late=True), CONFIG)
    shed = [r for r in result.finished.values() if r.finish_reason is FinishReason.ERROR]
    assert result.preemptions > 0 and len(shed) > 0
    assert all(r.num_output_tokens == 0 for r in shed)
    assert policy_figures(result)["slo_attainment"] >= 0.6


async def test_edf_serves_requests_without_objectives():
    # a request without objectives among a stream of tight ones is not last forever
    workload = [WorkloadRequest("plain", 0.0, 8, 8)]
    workload += [WorkloadRequest(f"t{i:03d}", round(i * 0.1, 6), 8, 8,
                                 meta=RequestMeta(ttft_slo_ms=300))
                 for i in range(400)]
    result = await simulate(workload, EDFScheduler(), SimConfig(slots=1, step_ms=20))
    plain = result.finished["plain"].metrics
    assert plain.first_scheduled_time <= 10.0 + 0.2  # its default 10 s objective


# -- mlfq --------------------------------------------------------------------------------

async def test_mlfq_cuts_mean_e2e_on_heavy_tail_without_length_knowledge():
    # The flat timing makes prefill and recomputation free, which flatters eviction;
    # 0.05 ms per prompt or recomputed token charges them (a 400-token prefill costs a
    # step). fcfs then finishes 10.8 req/s saturated (n=600 at 20 req/s): rate 13 is
    # 1.2x capacity for 50 s (10x promote_after_s). Measured: 0.65x fcfs (87 preemptions).
    config = SimConfig(slots=8, kv_blocks=64, step_ms=20, prefill_ms_per_token=0.05)
    workload = heavy_tail(n=650, rate=13)
    fcfs = policy_figures(await simulate(workload, "fcfs", config))
    mlfq = policy_figures(await simulate(workload, MLFQScheduler(), config))
    assert mlfq["mean_e2e_s"] <= 0.7 * fcfs["mean_e2e_s"]
    assert mlfq["finished"] == fcfs["finished"] == 650


async def test_mlfq_keeps_its_promise_where_recomputation_is_dear():
    # A profile calibrated on this 2-core machine (stories260K): a prompt token costs 37%
    # of an 8-row decode step's 2.7 ms, so a recomputed 80-token request stalls the batch
    # for a step. fcfs finishes 85 req/s saturated: 1.2x is 102 req/s, for 6.4 s, 12x
    # the promotion window set here (0.5 s). Measured 0.68x fcfs's mean E2E with 3
    # evictions (0.69x never evicting); promoting every starving request to level 0
    # (FastServe's rule, the old one) 0.92x; evicting any worse level too (the old rule,
    # with a 5 s window) 1.01x.
    profile = StepCostModel(intercept_ms=1.841, per_seq_ms=0.1052,
                            per_prefill_token_ms=0.03865)
    config = SimConfig(slots=8, kv_blocks=64, cost_model=profile, overlap=True)
    workload = heavy_tail(n=650, rate=102)
    policy = MLFQScheduler(promote_after_s=0.5)
    fcfs = policy_figures(await simulate(workload, "fcfs", config))
    mlfq = policy_figures(await simulate(workload, policy, config))
    assert mlfq["mean_e2e_s"] <= 0.7 * fcfs["mean_e2e_s"]
    assert mlfq["finished"] == fcfs["finished"] == 650
    assert policy.evictions > 0  # the gain rule still evicts where it pays
    assert policy.contested > 100  # starving requests waited with others: they got their share
    assert abs(policy.shared / policy.contested - policy.promote_share) <= 0.01


async def test_mlfq_never_runs_more_than_batch_size_rows():
    # 8 slots, batch_size 4: when the best requests wait and every slot is held, the old
    # decision paused every running request and admitted none; the engine, refusing an
    # empty step, ran them all (hundreds of steps over batch_size)
    rows: list[int] = []

    def watch(core, feedback: StepFeedback) -> None:
        rows.append(feedback.num_seqs)

    await simulate(heavy_tail(n=200, rate=20), MLFQScheduler(batch_size=4), CONFIG,
                   on_step=watch)
    assert len(rows) > 500 and max(rows) == 4
