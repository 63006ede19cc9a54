"""Serving metrics from request records: latency statistics, throughput, goodput."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from aioserve.bench.online.serving import RequestRecord


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linearly interpolated as numpy's default."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_stats(seconds: list[float]) -> dict[str, float]:
    """``mean``, ``median`` and ``p99`` in milliseconds (NaN when empty)."""
    if not seconds:
        return {"mean_ms": float("nan"), "median_ms": float("nan"), "p99_ms": float("nan")}
    ms = [s * 1000 for s in seconds]
    return {
        "mean_ms": statistics.fmean(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 99),
    }


@dataclass(frozen=True)
class ServingResult:
    """A serving run's summary: latency statistics, rates, goodput and prefix hit rate."""

    endpoint: str
    completed: int
    failed: int
    duration_s: float
    metrics: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "completed": self.completed, "failed": self.failed,
                "duration_s": self.duration_s, **self.metrics}

    def summary(self) -> str:
        m = self.metrics
        lines = [
            f"endpoint {self.endpoint}: {self.completed} completed, {self.failed} failed "
            f"in {self.duration_s:.2f} s",
            f"request throughput {m['request_throughput']:.2f} req/s, output "
            f"{m['output_throughput']:.1f} tok/s, total {m['total_token_throughput']:.1f} tok/s, "
            f"goodput {m['goodput']:.2f} req/s, prefix cache hits {m['prefix_hit_rate']:.1%}",
        ]
        for name in ("ttft", "tpot", "itl", "e2e"):
            s = m[name]
            lines.append(f"{name.upper():>5} ms: mean {s['mean_ms']:8.2f}  median "
                         f"{s['median_ms']:8.2f}  p99 {s['p99_ms']:8.2f}")
        for group, g in m.get("groups", {}).items():
            lines.append(f"  {group}: {g['requests']} requests, TTFT mean "
                         f"{g['ttft']['mean_ms']:.1f} p99 {g['ttft']['p99_ms']:.1f} ms, E2E mean "
                         f"{g['e2e']['mean_ms']:.1f} ms")
        return "\n".join(lines)


def _groups(done: list[RequestRecord]) -> dict[str, dict[str, Any]]:
    groups: dict[tuple[str | None, int], list[RequestRecord]] = {}
    for record in done:
        groups.setdefault(record.group, []).append(record)
    if len(groups) < 2:
        return {}
    return {f"{tenant or '-'} p{priority}": {
        "requests": len(rs), "ttft": latency_stats([r.ttft for r in rs]),
        "e2e": latency_stats([r.e2e for r in rs])}
        for (tenant, priority), rs in sorted(groups.items(), key=str)}


def meets_slo(record: RequestRecord, slo_ttft_ms: float = float("inf"),
              slo_tpot_ms: float = float("inf")) -> bool:
    """Whether a request succeeded within its own objectives, else those given."""
    return record.ok and (record.ttft * 1000 <= (record.slo_ms[0] or slo_ttft_ms)
                          and (record.tpot or 0.0) * 1000 <= (record.slo_ms[1] or slo_tpot_ms))


def summarize(
    records: list[RequestRecord],
    duration_s: float,
    endpoint: str,
    *,
    slo_ttft_ms: float = float("inf"),
    slo_tpot_ms: float = float("inf"),
) -> ServingResult:
    """Statistics over the successful requests; goodput as ``vllm bench serve --goodput``."""
    done = [r for r in records if r.ok]
    tpots = [t for r in done if (t := r.tpot) is not None]
    good = [r for r in done if meets_slo(r, slo_ttft_ms, slo_tpot_ms)]
    out_tokens = sum(r.output_tokens for r in done)
    metrics: dict[str, Any] = {
        "ttft": latency_stats([r.ttft for r in done]),
        "tpot": latency_stats(tpots),
        "itl": latency_stats([g for r in done for g in r.itl]),
        "e2e": latency_stats([r.e2e for r in done]),
        "request_throughput": len(done) / duration_s,
        "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (out_tokens + sum(r.prompt_len for r in done)) / duration_s,
        "goodput": len(good) / duration_s,
        "prefix_hit_rate": sum(r.cached_tokens for r in done)
        / max(1, sum(r.prompt_len for r in done)),
        "slo_ttft_ms": slo_ttft_ms,
        "slo_tpot_ms": slo_tpot_ms,
        "groups": _groups(done),
    }
    return ServingResult(endpoint, len(done), len(records) - len(done), duration_s, metrics)
