"""The cluster report: per router, goodput, prefix-cache hits and load imbalance, and each
replica's share (goodput as DistServe's: requests meeting their objectives per second of
the cluster's makespan, so the replicas' figures add up to the cluster's)."""

from __future__ import annotations

import math
from typing import Any

from aioserve.dashboard.frames import percentile
from aioserve.sim.cluster import ClusterResult
from aioserve.sim.reports.compare import Table, format_table
from aioserve.sim.reports.figures import meets
from aioserve.sim.reports.report import mean


def imbalance(values: list[float]) -> float | None:
    """max / mean (1: even; n: one replica has it all); None when all are 0."""
    average = math.fsum(values) / len(values) if values else 0.0
    return max(values) / average if average > 0 else None


def cluster_figures(result: ClusterResult, slo_ttft_ms: float | None = None,
                    slo_tpot_ms: float | None = None) -> dict[str, Any]:
    """The cluster's figures and each replica's (seconds, tokens, requests/s, fractions)."""
    start = min((w.arrival_s for w in result.workload), default=0.0)
    ends = [r.metrics.finished_time for rep in result.replicas for r in rep.finished.values()
            if r.metrics.finished_time is not None]
    makespan = max(ends, default=start) - start
    rows: list[dict[str, Any]] = []
    ttfts: list[float] = []
    good_total = 0
    for index, rep in enumerate(result.replicas):
        items = {w.id: w for w in rep.workload}
        done = [(r, items[k]) for k, r in rep.finished.items() if k in items
                and r.finish_reason is not None and r.finish_reason.value != "error"]
        good = sum(meets(r, w, slo_ttft_ms, slo_tpot_ms) for r, w in done)
        good_total += good
        ttft = [r.metrics.first_token_time - w.arrival_s for r, w in done
                if r.metrics.first_token_time is not None]
        ttfts += ttft
        core = rep.core
        rows.append({
            "replica": index, "requests": len(rep.workload), "finished": len(done),
            "prompt_tokens": sum(w.prompt_len for w in rep.workload),
            "output_tokens": sum(r.num_output_tokens for r, _ in done),
            "busy_s": math.fsum(s.end_s - s.start_s for s in rep.steps),
            "prefix_hit_rate": (core.prefix_cache_hits / core.prefix_cache_queries
                                if core.prefix_cache_queries else None),
            "goodput_req_s": good / makespan if makespan > 0 else 0.0,
            "mean_ttft_s": mean(ttft), "preemptions": rep.preemptions,
        })
    queries = sum(rep.core.prefix_cache_queries for rep in result.replicas)
    hits = sum(rep.core.prefix_cache_hits for rep in result.replicas)
    goodput = good_total / makespan if makespan > 0 else 0.0
    return {
        "router": result.router, "scheduler": result.scheduler,
        "replicas": len(result.replicas), "requests": len(result.workload),
        "finished": sum(row["finished"] for row in rows), "makespan_s": makespan,
        "throughput_req_s": (sum(row["finished"] for row in rows) / makespan
                             if makespan > 0 else 0.0),
        "goodput_req_s": goodput, "goodput_per_replica_req_s": goodput / len(rows),
        "slo_attainment": good_total / len(result.workload) if result.workload else None,
        "mean_ttft_s": mean(ttfts), "p99_ttft_s": percentile(ttfts, 99),
        "prefix_hit_rate": hits / queries if queries else None,
        "imbalance_requests": imbalance([row["requests"] for row in rows]),
        "imbalance_busy": imbalance([row["busy_s"] for row in rows]),
        "per_replica": rows,
    }


def _cell(value: Any, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def format_cluster(runs: list[dict[str, Any]], title: str = "") -> str:
    """One table of the routers, then one of the replicas per router."""
    routers = Table("routers", [
        "router", "policy", "goodput req/s", "per replica", "SLO %", "TTFT mean (s)",
        "TTFT p99 (s)", "prefix hit %", "imbalance req", "imbalance busy"],
        [[r["router"], r["scheduler"], _cell(r["goodput_req_s"]),
          _cell(r["goodput_per_replica_req_s"]), _cell(r["slo_attainment"], 100, 1),
          _cell(r["mean_ttft_s"], digits=3), _cell(r["p99_ttft_s"], digits=3),
          _cell(r["prefix_hit_rate"], 100, 1), _cell(r["imbalance_requests"]),
          _cell(r["imbalance_busy"])] for r in runs])
    blocks = [title] if title else []
    blocks.append(format_table(routers))
    for run in runs:
        table = Table(f"{run['router']} ({run['scheduler']}): per replica", [
            "replica", "requests", "prompt tok", "output tok", "busy (s)", "prefix hit %",
            "goodput req/s", "TTFT mean (s)", "preemptions"],
            [[str(row["replica"]), str(row["requests"]), str(row["prompt_tokens"]),
              str(row["output_tokens"]), _cell(row["busy_s"], digits=1),
              _cell(row["prefix_hit_rate"], 100, 1), _cell(row["goodput_req_s"]),
              _cell(row["mean_ttft_s"], digits=3), str(row["preemptions"])]
             for row in run["per_replica"]])
        blocks.append(f"\n{table.title}\n{format_table(table)}")
    return "\n".join(blocks)
