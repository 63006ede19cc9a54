"""A live serving run's report (``bench serve``): latency statistics, throughput, goodput,
from the same outcome records, SLO rule and percentile as a simulated run's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aioserve.reports.outcome import Outcome
from aioserve.reports.slo import goodput
from aioserve.reports.stats import latency_stats


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
        for reason, count in m.get("failures", {}).items():
            lines.append(f"  failed {count}: {reason}")
        return "\n".join(lines)


def _groups(done: list[Outcome]) -> dict[str, dict[str, Any]]:
    groups: dict[tuple[str | None, int], list[Outcome]] = {}
    for o in done:
        groups.setdefault((o.tenant, o.priority), []).append(o)
    if len(groups) < 2:
        return {}
    return {f"{tenant or '-'} p{priority}": {
        "requests": len(os), "ttft": latency_stats([o.ttft or 0.0 for o in os]),
        "e2e": latency_stats([o.e2e or 0.0 for o in os])}
        for (tenant, priority), os in sorted(groups.items(), key=str)}


def summarize(
    outcomes: list[Outcome],
    duration_s: float,
    endpoint: str,
    *,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> ServingResult:
    """Statistics over the successful requests; goodput as ``vllm bench serve --goodput``
    (by :mod:`aioserve.reports.slo`'s rule, each request's own objectives first)."""
    done = [o for o in outcomes if o.ok]
    tpots = [t for o in done if (t := o.tpot) is not None]
    out_tokens = sum(o.output_tokens for o in done)
    failures: dict[str, int] = {}
    for o in outcomes:
        if o.error is not None:
            failures[o.error[:80]] = failures.get(o.error[:80], 0) + 1
    metrics: dict[str, Any] = {
        "ttft": latency_stats([o.ttft or 0.0 for o in done]),
        "tpot": latency_stats(tpots),
        "itl": latency_stats([g for o in done for g in o.itl]),
        "e2e": latency_stats([o.e2e or 0.0 for o in done]),
        "request_throughput": len(done) / duration_s,
        "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (out_tokens + sum(o.prompt_len for o in done)) / duration_s,
        "goodput": goodput(outcomes, duration_s, slo_ttft_ms, slo_tpot_ms),
        "prefix_hit_rate": sum(o.cached_tokens for o in done)
        / max(1, sum(o.prompt_len for o in done)),
        "slo_ttft_ms": slo_ttft_ms,
        "slo_tpot_ms": slo_tpot_ms,
        "groups": _groups(done),
        "failures": failures,
    }
    return ServingResult(endpoint, len(done), len(outcomes) - len(done), duration_s, metrics)
