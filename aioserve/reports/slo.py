"""The SLO rule and goodput (DistServe, Zhong et al., OSDI'24: requests per second that meet
every objective they carry), the one rule for simulated and live runs alike."""

from __future__ import annotations

from collections.abc import Sequence

from aioserve.reports.outcome import Outcome


def meets_slo(outcome: Outcome, ttft_ms: float | None = None,
              tpot_ms: float | None = None) -> bool:
    """Whether a request finished and met every objective: its own TTFT and TPOT objectives,
    else the defaults given (None: none), and its deadline (a one-token request has no TPOT)."""
    if not outcome.ok or outcome.finish_s is None:
        return False
    ttft_slo = outcome.ttft_slo_ms if outcome.ttft_slo_ms is not None else ttft_ms
    tpot_slo = outcome.tpot_slo_ms if outcome.tpot_slo_ms is not None else tpot_ms
    ttft, tpot = outcome.ttft, outcome.tpot
    if ttft_slo is not None and ttft is not None and ttft * 1e3 > ttft_slo:
        return False
    if tpot_slo is not None and tpot is not None and tpot * 1e3 > tpot_slo:
        return False
    return outcome.deadline_s is None or outcome.finish_s <= outcome.deadline_s


def good_count(outcomes: Sequence[Outcome], ttft_ms: float | None = None,
               tpot_ms: float | None = None) -> int:
    """How many requests met their objectives (:func:`meets_slo`)."""
    return sum(meets_slo(o, ttft_ms, tpot_ms) for o in outcomes)


def goodput(outcomes: Sequence[Outcome], duration_s: float, ttft_ms: float | None = None,
            tpot_ms: float | None = None) -> float:
    """Requests per second of ``duration_s`` that met their objectives (0 for no duration)."""
    return good_count(outcomes, ttft_ms, tpot_ms) / duration_s if duration_s > 0 else 0.0


def carries_objective(outcomes: Sequence[Outcome], ttft_ms: float | None,
                      tpot_ms: float | None) -> bool:
    """Whether any objective applies (a default given, or a request's own)."""
    return ttft_ms is not None or tpot_ms is not None or any(
        o.ttft_slo_ms is not None or o.tpot_slo_ms is not None or o.deadline_s is not None
        for o in outcomes)
