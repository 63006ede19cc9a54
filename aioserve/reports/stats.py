"""The statistics every report uses: one percentile, one mean, one latency summary."""

from __future__ import annotations

import math
import statistics


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linearly interpolated between ranks (numpy's default,
    as ``vllm bench serve`` reports); None when ``values`` is empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: list[float]) -> float | None:
    """The mean, or None when empty."""
    return math.fsum(values) / len(values) if values else None


def latency_stats(seconds: list[float]) -> dict[str, float]:
    """``mean_ms``, ``median_ms`` and ``p99_ms`` in milliseconds (NaN when empty)."""
    if not seconds:
        return {"mean_ms": math.nan, "median_ms": math.nan, "p99_ms": math.nan}
    ms = [s * 1000 for s in seconds]
    return {"mean_ms": statistics.fmean(ms), "median_ms": percentile(ms, 50) or 0.0,
            "p99_ms": percentile(ms, 99) or 0.0}
