"""The figures that compare policies, from one run (simulated or real).

TTFT, TPOT and E2E as vLLM's serving benchmark defines them; goodput as DistServe's
(requests/s meeting every objective they carry); Jain's index (sum x)^2 / (n sum x^2)
(Jain, Chiu, Hawe, DEC-TR-301, 1984) over the service tenants got (divided by the
policy's tenant ``weights`` where it has them), counted as VTC counts it, in the steps
where every tenant had a request waiting (its window: those steps / all steps)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

from aioserve.engine.admission import REFUSAL_REASONS
from aioserve.reports.lengths import kendall_tau, mean_absolute_error
from aioserve.reports.outcome import Outcome, simulated
from aioserve.reports.slo import carries_objective, good_count, goodput
from aioserve.reports.stats import mean, percentile
from aioserve.scheduling import Scheduler
from aioserve.sim.simulator import SimResult


def jain(values: list[float], weights: list[float] | None = None) -> float | None:
    """Jain's fairness index of ``values`` (1: all equal; 1/n: one gets everything); with
    ``weights``, of ``value / weight`` (1: shares in proportion to the weights)."""
    if weights is not None:
        values = [v / w for v, w in zip(values, weights, strict=True)]
    total, squares = math.fsum(values), math.fsum(v * v for v in values)
    return total * total / (len(values) * squares) if squares > 0 else None


def run_policy(result: SimResult) -> Scheduler:
    """The policy that ran (the engine's may have changed since, in ``--real``)."""
    return result.policy if result.policy is not None else result.core.guard.policy


def tenant_weights(result: SimResult, tenants: list[str | None]) -> list[float] | None:
    """The per-tenant ``weights`` of the policy's report (missing tenants weigh 1), or None
    without any."""
    weights = run_policy(result).report().get("weights")
    if not isinstance(weights, dict) or not weights:
        return None
    return [float(weights.get(t, 1.0)) if t is not None else 1.0 for t in tenants]


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


def outcomes(result: SimResult) -> list[Outcome]:
    """Each request's outcome, in workload order (rejected and unfinished ones with why)."""
    return [simulated(w, result.finished.get(w.id), result.rejected.get(w.id))
            for w in result.workload]


def latencies(done: list[Outcome]) -> dict[str, float | None]:
    """TTFT, TPOT and E2E means and percentiles (seconds) of finished requests."""
    ttft = [t for o in done if (t := o.ttft) is not None]
    e2e = [t for o in done if (t := o.e2e) is not None]
    tpot = [t for o in done if (t := o.tpot) is not None]
    return {"mean_ttft_s": mean(ttft), "p50_ttft_s": percentile(ttft, 50),
            "p99_ttft_s": percentile(ttft, 99), "mean_tpot_s": mean(tpot),
            "p99_tpot_s": percentile(tpot, 99), "mean_e2e_s": mean(e2e),
            "p50_e2e_s": percentile(e2e, 50), "p99_e2e_s": percentile(e2e, 99)}


def makespan(every: list[Outcome]) -> float:
    """First arrival to last finish (s) of a run's requests."""
    start = min((o.arrival_s for o in every), default=0.0)
    return max((o.finish_s for o in every if o.ok and o.finish_s is not None),
               default=start) - start


def outcome_figures(every: list[Outcome], duration_s: float, slo_ttft_ms: float | None,
                    slo_tpot_ms: float | None) -> dict[str, Any]:
    """The figures any run has, from its outcomes alone: counts, throughput, goodput, SLO
    attainment and latencies over ``duration_s``."""
    done = [o for o in every if o.ok]
    tokens = sum(o.output_tokens for o in done)
    good = good_count(every, slo_ttft_ms, slo_tpot_ms)
    with_objective = carries_objective(every, slo_ttft_ms, slo_tpot_ms)
    return {
        "finished": len(done), "failed": len(every) - len(done), "makespan_s": duration_s,
        "throughput_tok_s": tokens / duration_s if duration_s > 0 else 0.0,
        "throughput_req_s": len(done) / duration_s if duration_s > 0 else 0.0,
        "goodput_req_s": goodput(every, duration_s, slo_ttft_ms, slo_tpot_ms),
        "slo_attainment": good / len(every) if every and with_objective else None,
        **latencies(done),
    }


def backlogged_window(result: SimResult) -> tuple[dict[str | None, float], int]:
    """Each tenant's service (input + 2 x output tokens) while every tenant had one waiting,
    and the number of steps it counts (Jain's window)."""
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
    every = outcomes(result)
    done = [o for o in every if o.ok]
    waits = [o.first_scheduled_s - o.arrival_s for o in done if o.first_scheduled_s is not None]
    tenants: dict[str | None, list[Outcome]] = defaultdict(list)
    priorities: dict[int, list[Outcome]] = defaultdict(list)
    for o in done:
        tenants[o.tenant].append(o)
        priorities[o.priority].append(o)
    service, window = backlogged_window(result)
    names = list(service)
    weights = tenant_weights(result, names)
    return {
        "scheduler": result.scheduler,
        **outcome_figures(every, makespan(every), slo_ttft_ms, slo_tpot_ms),
        "max_wait_s": max(waits, default=None),
        "preemptions": result.preemptions, "recomputed_tokens": result.preempted_tokens,
        "prefix_hit_rate": (result.core.prefix_cache_hits / result.core.prefix_cache_queries
                            if result.core.prefix_cache_queries else None),
        "jain_index": jain(list(service.values()), weights) if len(service) > 1 else None,
        "jain_weights": dict(zip(map(str, names), weights)) if weights else None,
        "jain_window": f"{window}/{len(result.feedback)}" if len(service) > 1 else None,
        **prediction_figures(result),
        "rejected": rejections(every),
        "tenants": {str(t): {"requests": len(p), "backlogged_service": service.get(t, 0.0),
                             "output_tokens": sum(o.output_tokens for o in p),
                             **latencies(p)} for t, p in sorted(tenants.items(), key=str)},
        "priorities": {str(k): {"requests": len(p), **latencies(p)}
                       for k, p in sorted(priorities.items())},
    }


def rejections(every: list[Outcome]) -> dict[str, int]:
    """How many requests failed, by :func:`reason_kind`."""
    counts: dict[str, int] = {}
    for o in every:
        if o.error is not None:
            key = reason_kind(o.error)
            counts[key] = counts.get(key, 0) + 1
    return counts


def admission_refusals(every: list[Outcome]) -> int:
    """Requests the admission limit refused (``queue_full``, ``queue_timeout``; a live
    server's 429 reads the same, see :func:`~aioserve.bench.online.serving.http_refusal`)."""
    return sum(o.error is not None and reason_kind(o.error) in REFUSAL_REASONS for o in every)


def rejection_warning(label: str, every: list[Outcome]) -> str | None:
    """A one-line warning of a run's failed requests, counted by reason with the first
    reason in full; None when every request finished."""
    failed = [o for o in every if o.error is not None]
    if not failed:
        return None
    kinds = "; ".join(f"{count} {why}" for why, count in rejections(every).items())
    return (f"warning: {label}: {len(failed)} of {len(every)} requests not served ({kinds}); "
            f"first: {failed[0].id}: {failed[0].error}")


def reason_kind(reason: str) -> str:
    """A failure's kind: its words up to the first ": " or ", ", numbers as N (so the
    engine's reasons, and admission limits yet to come, are counted alike)."""
    head = reason
    for stop in (": ", ", "):
        head = head.split(stop, 1)[0]
    return re.sub(r"\d+(\.\d+)?", "N", head).strip() or reason
