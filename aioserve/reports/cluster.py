"""The cluster report: per router, goodput, prefix-cache hits and load imbalance, and each
replica's share (goodput as DistServe's: requests meeting their objectives per second of
the cluster's makespan, so the replicas' figures add up to the cluster's)."""

from __future__ import annotations

import math
from typing import Any

from aioserve.reports.compare import Table, cell, format_table
from aioserve.reports.figures import makespan, outcomes, rejections
from aioserve.reports.slo import good_count, goodput
from aioserve.reports.stats import mean, percentile
from aioserve.sim.cluster import ClusterResult


def imbalance(values: list[float]) -> float | None:
    """max / mean (1: even; n: one replica has it all); None when all are 0."""
    average = math.fsum(values) / len(values) if values else 0.0
    return max(values) / average if average > 0 else None


def cluster_figures(result: ClusterResult, slo_ttft_ms: float | None = None,
                    slo_tpot_ms: float | None = None) -> dict[str, Any]:
    """The cluster's figures and each replica's (seconds, tokens, requests/s, fractions)."""
    every = {index: outcomes(rep) for index, rep in enumerate(result.replicas)}
    span = makespan([o for found in every.values() for o in found])
    rows: list[dict[str, Any]] = []
    for index, rep in enumerate(result.replicas):
        done = [o for o in every[index] if o.ok]
        core = rep.core
        rows.append({
            "replica": index, "requests": len(rep.workload), "finished": len(done),
            "prompt_tokens": sum(w.prompt_len for w in rep.workload),
            "output_tokens": sum(o.output_tokens for o in done),
            "busy_s": math.fsum(s.end_s - s.start_s for s in rep.steps),
            "prefix_hit_rate": (core.prefix_cache_hits / core.prefix_cache_queries
                                if core.prefix_cache_queries else None),
            "goodput_req_s": goodput(every[index], span, slo_ttft_ms, slo_tpot_ms),
            "mean_ttft_s": mean([t for o in done if (t := o.ttft) is not None]),
            "preemptions": rep.preemptions,
        })
    queries = sum(rep.core.prefix_cache_queries for rep in result.replicas)
    hits = sum(rep.core.prefix_cache_hits for rep in result.replicas)
    total = [o for found in every.values() for o in found]
    ttfts = [t for o in total if o.ok and (t := o.ttft) is not None]
    good = goodput(total, span, slo_ttft_ms, slo_tpot_ms)
    return {
        "router": result.router, "scheduler": result.scheduler,
        "replicas": len(result.replicas), "requests": len(result.workload),
        "finished": sum(row["finished"] for row in rows), "makespan_s": span,
        "throughput_req_s": (sum(row["finished"] for row in rows) / span
                             if span > 0 else 0.0),
        "goodput_req_s": good, "goodput_per_replica_req_s": good / len(rows),
        "slo_attainment": (good_count(total, slo_ttft_ms, slo_tpot_ms) / len(total)
                           if total else None),
        "rejected": rejections(total),
        "mean_ttft_s": mean(ttfts), "p99_ttft_s": percentile(ttfts, 99),
        "prefix_hit_rate": hits / queries if queries else None,
        "imbalance_requests": imbalance([row["requests"] for row in rows]),
        "imbalance_busy": imbalance([row["busy_s"] for row in rows]),
        "per_replica": rows,
    }


def format_cluster(runs: list[dict[str, Any]], title: str = "") -> str:
    """One table of the routers, then one of the replicas per router."""
    routers = Table("routers", [
        "router", "policy", "goodput/s", "/replica", "SLO %", "TTFT mean", "TTFT p99",
        "prefix %", "imb. req", "imb. busy"],
        [[r["router"], r["scheduler"], cell(r["goodput_req_s"]),
          cell(r["goodput_per_replica_req_s"]), cell(r["slo_attainment"], 100, 1),
          cell(r["mean_ttft_s"], digits=3), cell(r["p99_ttft_s"], digits=3),
          cell(r["prefix_hit_rate"], 100, 1), cell(r["imbalance_requests"]),
          cell(r["imbalance_busy"])] for r in runs])
    blocks = [title] if title else []
    blocks += [format_table(routers), "goodput: requests/s meeting their SLO; TTFT in s; imb.: "
               "max / mean over replicas", "(1: even; every figure: --json)"]
    for run in runs:
        table = Table(f"{run['router']} ({run['scheduler']}): per replica", [
            "replica", "requests", "prompt tok", "output tok", "busy (s)", "prefix %",
            "goodput/s", "TTFT mean", "preempt"],
            [[str(row["replica"]), str(row["requests"]), str(row["prompt_tokens"]),
              str(row["output_tokens"]), cell(row["busy_s"], digits=1),
              cell(row["prefix_hit_rate"], 100, 1), cell(row["goodput_req_s"]),
              cell(row["mean_ttft_s"], digits=3), str(row["preemptions"])]
             for row in run["per_replica"]])
        blocks.append(f"\n{table.title}\n{format_table(table)}")
    return "\n".join(blocks)
