"""The figures that compare policies, from one run (simulated or real).

TTFT, TPOT and E2E as vLLM's serving benchmark defines them; goodput as DistServe's
(requests/s meeting every objective they carry); Jain's index (sum x)^2 / (n sum x^2)
(Jain, Chiu, Hawe, DEC-TR-301, 1984) over the service tenants got (divided by the
policy's tenant ``weights`` where it has them), counted as VTC counts it, in the steps
where every tenant had a request waiting (its window: those steps / all steps)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from aioserve.dashboard.frames import percentile
from aioserve.request import Request
from aioserve.sim.reports.lengths import kendall_tau, mean_absolute_error
from aioserve.sim.reports.report import mean
from aioserve.sim.simulator import SimResult
from aioserve.sim.workloads import WorkloadRequest


def jain(values: list[float], weights: list[float] | None = None) -> float | None:
    """Jain's fairness index of ``values`` (1: all equal; 1/n: one gets everything); with
    ``weights``, of ``value / weight`` (1: shares in proportion to the weights)."""
    if weights is not None:
        values = [v / w for v, w in zip(values, weights, strict=True)]
    total, squares = math.fsum(values), math.fsum(v * v for v in values)
    return total * total / (len(values) * squares) if squares > 0 else None


def run_policy(result: SimResult) -> object:
    """The policy that ran (the engine's may have changed since, in ``--real``)."""
    return result.policy if result.policy is not None else result.core.guard.policy


def tenant_weights(result: SimResult, tenants: list[str | None]) -> list[float] | None:
    """The policy's per-tenant ``weights`` (missing tenants weigh 1), or None without any."""
    weights = getattr(run_policy(result), "weights", None)
    if not isinstance(weights, dict) or not weights:
        return None
    return [float(weights.get(t, 1.0)) if t is not None else 1.0 for t in tenants]


def carries_objective(item: WorkloadRequest, ttft_ms: float | None,
                      tpot_ms: float | None) -> bool:
    """Whether any objective applies to the request (its own or a default given)."""
    meta = item.meta
    return (ttft_ms is not None or tpot_ms is not None or meta.ttft_slo_ms is not None
            or meta.tpot_slo_ms is not None or item.deadline_s is not None)


def prediction_figures(result: SimResult, skip_first: int = 100) -> dict[str, Any]:
    """Kendall's tau and MAE of the policy's length predictions at arrival (its
    ``outcomes``: (id, predicted, true)), over all requests and over those after the first
    ``skip_first`` arrivals (a learner's warm-up); None where the policy predicts none."""
    outcomes = getattr(run_policy(result), "outcomes", None)
    ids = {w.id for w in result.workload}
    pairs = {i: (p, t) for i, p, t in outcomes or () if i in ids}
    if not pairs:
        return {"prediction_tau": None, "prediction_mae": None,
                "prediction_tau_after": None, "prediction_skipped": skip_first}
    order = sorted(result.workload, key=lambda w: w.arrival_s)
    late = [pairs[w.id] for w in order[skip_first:] if w.id in pairs]
    every = list(pairs.values())
    return {
        "prediction_tau": kendall_tau([p for p, _ in every], [t for _, t in every]),
        "prediction_mae": mean_absolute_error([p for p, _ in every], [t for _, t in every]),
        "prediction_tau_after": kendall_tau([p for p, _ in late], [t for _, t in late]),
        "prediction_skipped": skip_first,
    }


def meets(request: Request, item: WorkloadRequest, ttft_ms: float | None,
          tpot_ms: float | None) -> bool:
    """Whether a finished request met every objective it carries, else the defaults given."""
    m = request.metrics
    if m.first_token_time is None or m.finished_time is None:
        return False
    ttft_slo = item.meta.ttft_slo_ms if item.meta.ttft_slo_ms is not None else ttft_ms
    tpot_slo = item.meta.tpot_slo_ms if item.meta.tpot_slo_ms is not None else tpot_ms
    if ttft_slo is not None and (m.first_token_time - item.arrival_s) * 1e3 > ttft_slo:
        return False
    tpot = _tpot(request)
    if tpot_slo is not None and tpot is not None and tpot * 1e3 > tpot_slo:
        return False
    return item.deadline_s is None or m.finished_time <= item.deadline_s


def _tpot(request: Request) -> float | None:
    m = request.metrics
    if request.num_output_tokens < 2 or m.first_token_time is None or m.last_token_time is None:
        return None
    return (m.last_token_time - m.first_token_time) / (request.num_output_tokens - 1)


def _latencies(requests: list[tuple[Request, WorkloadRequest]]) -> dict[str, float | None]:
    ttft = [r.metrics.first_token_time - w.arrival_s for r, w in requests
            if r.metrics.first_token_time is not None]
    e2e = [r.metrics.finished_time - w.arrival_s for r, w in requests
           if r.metrics.finished_time is not None]
    tpot = [t for r, _ in requests if (t := _tpot(r)) is not None]
    return {"mean_ttft_s": mean(ttft), "p50_ttft_s": percentile(ttft, 50),
            "p99_ttft_s": percentile(ttft, 99), "mean_tpot_s": mean(tpot),
            "p99_tpot_s": percentile(tpot, 99), "mean_e2e_s": mean(e2e),
            "p50_e2e_s": percentile(e2e, 50), "p99_e2e_s": percentile(e2e, 99)}


def backlogged_service(result: SimResult) -> dict[str | None, float]:
    """Each tenant's service (input + 2 x output tokens) while every tenant had one waiting."""
    return backlogged_window(result)[0]


def backlogged_window(result: SimResult) -> tuple[dict[str | None, float], int]:
    """:func:`backlogged_service` and the number of steps it counts (Jain's window)."""
    queued: dict[str | None, list[tuple[float, float]]] = defaultdict(list)
    tenant_of = {w.id: w.meta.tenant for w in result.workload}
    for w in result.workload:
        request = result.finished.get(w.id)
        start = request.metrics.first_scheduled_time if request is not None else None
        queued[w.meta.tenant].append((w.arrival_s, math.inf if start is None else start))
    service: dict[str | None, float] = dict.fromkeys(queued, 0.0)
    window = 0
    if len(queued) < 2:
        return service, window
    for step in result.feedback:
        t = step.start_time
        if all(any(a <= t < b for a, b in spans) for spans in queued.values()):
            window += 1
            for request_id, amount in step.served().items():
                service[tenant_of.get(request_id)] += amount
    return service, window


def policy_figures(result: SimResult, slo_ttft_ms: float | None = None,
                   slo_tpot_ms: float | None = None) -> dict[str, Any]:
    """Every comparison figure of one run (seconds, tokens, tokens/s, requests/s)."""
    items = {w.id: w for w in result.workload}
    done = [(r, items[k]) for k, r in result.finished.items() if k in items
            and r.finish_reason is not None and r.finish_reason.value != "error"]
    start = min((w.arrival_s for w in result.workload), default=0.0)
    end = max((r.metrics.finished_time or start for r, _ in done), default=start)
    makespan = end - start
    tokens = sum(r.num_output_tokens for r, _ in done)
    good = sum(meets(r, w, slo_ttft_ms, slo_tpot_ms) for r, w in done)
    waits = [r.metrics.first_scheduled_time - w.arrival_s for r, w in done
             if r.metrics.first_scheduled_time is not None]
    tenants: dict[str | None, list[tuple[Request, WorkloadRequest]]] = defaultdict(list)
    priorities: dict[int, list[tuple[Request, WorkloadRequest]]] = defaultdict(list)
    for pair in done:
        tenants[pair[1].meta.tenant].append(pair)
        priorities[pair[1].meta.priority].append(pair)
    service, window = backlogged_window(result)
    names = list(service)
    weights = tenant_weights(result, names)
    with_objective = any(carries_objective(w, slo_ttft_ms, slo_tpot_ms) for w in result.workload)
    return {
        "scheduler": result.scheduler, "finished": len(done),
        "failed": len(result.workload) - len(done), "makespan_s": makespan,
        "throughput_tok_s": tokens / makespan if makespan > 0 else 0.0,
        "throughput_req_s": len(done) / makespan if makespan > 0 else 0.0,
        "goodput_req_s": good / makespan if makespan > 0 else 0.0,
        "slo_attainment": good / len(result.workload) if result.workload and with_objective
        else None,
        **_latencies(done), "max_wait_s": max(waits, default=None),
        "preemptions": result.preemptions, "recomputed_tokens": result.preempted_tokens,
        "prefix_hit_rate": (result.core.prefix_cache_hits / result.core.prefix_cache_queries
                            if result.core.prefix_cache_queries else None),
        "jain_index": jain(list(service.values()), weights) if len(service) > 1 else None,
        "jain_weights": dict(zip(map(str, names), weights)) if weights else None,
        "jain_window": f"{window}/{len(result.feedback)}" if len(service) > 1 else None,
        **prediction_figures(result),
        "tenants": {str(t): {"requests": len(p), "backlogged_service": service.get(t, 0.0),
                             "output_tokens": sum(r.num_output_tokens for r, _ in p),
                             **_latencies(p)} for t, p in sorted(tenants.items(), key=str)},
        "priorities": {str(k): {"requests": len(p), **_latencies(p)}
                       for k, p in sorted(priorities.items())},
    }
