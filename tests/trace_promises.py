"""Each built-in policy's promise on the shipped traces (Azure conversation with its own
lengths, Mooncake conversation with prefix blocks): the workloads, the setting and the
figures that tests/test_sched_traces.py checks on small windows and
benchmarks/lab/policy_promises.py prints at full scale."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from aioserve.reports.figures import outcomes, policy_figures
from aioserve.reports.slo import meets_slo
from aioserve.request_meta import RequestMeta
from aioserve.sim.simulator import SimConfig, SimResult, simulate
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.trace_options import load_file

TRACES_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
#: trace -> (file, its options before n and rate)
TRACES = {
    "azure": ("azure-llm-2023-conv.csv", "start=600,len_scale=0.5,max_len=2048"),
    "mooncake": ("mooncake-2025-conversation.jsonl", "start=600,len_scale=auto,max_len=2048"),
}
#: the calibrated profile of tests/test_sched_promises.py (stories260K on 2 cores)
PROFILE = StepCostModel(intercept_ms=1.841, per_seq_ms=0.1052, per_prefill_token_ms=0.03865)
#: what each policy is run with (vtc weighs both tenants alike; priority as default)
POLICIES = ("mlfq", "spf", "vtc", "edf", "priority")


def trace_path(trace: str) -> Path:
    return TRACES_DIR / TRACES[trace][0]


def config(trace: str) -> SimConfig:
    """8 slots, 1,024 KV blocks of 16 tokens, one step ahead, prefix caching on Mooncake."""
    return SimConfig(slots=8, kv_blocks=1024, cost_model=PROFILE, overlap=True,
                     max_model_len=2048, max_num_batched_tokens=2048,
                     enable_prefix_caching=trace == "mooncake")


def window(trace: str, n: int, rate: float, start: float = 600.0) -> list[WorkloadRequest]:
    """``n`` requests of the trace from ``start`` s, arrivals scaled to ``rate`` req/s, each
    given what a policy's promise needs: tenant "light" (every 4th) or "heavy", priority
    0 (every 5th) or 1, a 2 s TTFT objective (every other one)."""
    path, options = TRACES[trace]
    options = options.replace("start=600", f"start={start:g}")
    items = load_file(TRACES_DIR / path, f"{options},n={n},rate={rate:.6g}")
    return [replace(w, meta=RequestMeta(tenant="light" if i % 4 == 0 else "heavy",
                                        priority=0 if i % 5 == 0 else 1,
                                        ttft_slo_ms=2000.0 if i % 2 == 0 else None))
            for i, w in enumerate(items)]


async def capacity(trace: str, n: int, start: float = 600.0) -> float:
    """fcfs's throughput (req/s) on the window sent all at once: the rate its queue
    stays bounded at."""
    result = await simulate(window(trace, n, 10_000.0, start), "fcfs", config(trace))
    return float(policy_figures(result)["throughput_req_s"])


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def figures(result: SimResult) -> dict[str, Any]:
    """Mean E2E; mean TTFT of the light tenant and of priority 0; SLO attainment of the
    requests with an objective."""
    items = {w.id: w for w in result.workload}
    done = list(result.finished.items())

    def ttft(keep) -> float:
        return mean([r.metrics.first_token_time - r.arrival_time for _, r in done
                     if keep(r) and r.metrics.first_token_time is not None])

    slo = [k for k, w in items.items() if w.meta.ttft_slo_ms is not None]
    by_id = {o.id: o for o in outcomes(result)}
    return {
        "mean_e2e_s": float(policy_figures(result)["mean_e2e_s"]),
        "light_ttft_s": ttft(lambda r: r.meta.tenant == "light"),
        "high_ttft_s": ttft(lambda r: r.meta.priority == 0),
        "slo_attainment": mean([float(k in result.finished and meets_slo(by_id[k]))
                                for k in slo]),
        "preemptions": float(result.preemptions),
        "finished": float(len(result.finished)),
    }


#: policy -> (figure, what it promises against fcfs's figure on the same window)
PROMISES = {
    "mlfq": ("mean_e2e_s", "at most 1.02x fcfs's mean E2E"),
    "spf": ("mean_e2e_s", "at most 1.02x fcfs's mean E2E"),
    "vtc": ("light_ttft_s", "the light tenant's mean TTFT at most fcfs's"),
    "edf": ("slo_attainment", "TTFT-objective attainment at least fcfs's"),
    "priority": ("high_ttft_s", "priority 0's mean TTFT at most fcfs's"),
}


def kept(policy: str, got: dict[str, Any], fcfs: dict[str, Any]) -> bool:
    """Whether the policy kept its promise (PROMISES) against fcfs on the same window."""
    figure = PROMISES[policy][0]
    if policy in ("mlfq", "spf"):
        return bool(got[figure] <= 1.02 * fcfs[figure])
    if policy == "edf":
        return bool(got[figure] >= fcfs[figure])
    return bool(got[figure] <= fcfs[figure])
