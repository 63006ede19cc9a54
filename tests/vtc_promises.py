"""vtc's floors beside the burst test (issue 50): the workload, the setting and the figures
that tests/test_sched_vtc_floors.py checks at CI scale and benchmarks/lab/policy_promises.py
prints at full scale (3 seeds).

A heavy tenant at ``load`` x capacity (two-tenants' lengths, Poisson arrivals) and a light
tenant at a fixed 0.2x capacity, on the calibrated profile (8 slots, 64 KV blocks of 16
tokens, one step ahead). The light tenant's stream is the same at every load, so its mean
TTFT at two loads measures isolation."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from trace_promises import PROFILE

from aioserve.reports.figures import policy_figures
from aioserve.request_meta import RequestMeta
from aioserve.scheduling import StepFeedback
from aioserve.sim.simulator import SimConfig, SimResult, simulate
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import two_tenants

CONFIG = SimConfig(slots=8, kv_blocks=64, cost_model=PROFILE, overlap=True)
#: the paper's weights (w_p, w_q) as VTCScheduler's defaults
PROMPT_WEIGHT, OUTPUT_WEIGHT = 1.0, 2.0
#: two-tenants' longest prompt
MAX_PROMPT = 64


async def capacity() -> float:
    """fcfs's throughput (req/s) on the heavy tenant's requests sent all at once."""
    workload = two_tenants(n=600, rate=1e4, light=0.0, burst=1, seed=0)
    return float(policy_figures(await simulate(workload, "fcfs", CONFIG))["throughput_req_s"])


def mix(load: float, cap: float, seed: int, n_light: int) -> list[WorkloadRequest]:
    """``n_light`` light requests at 0.2x ``cap`` req/s and, over the same span, the heavy
    tenant at ``load`` x ``cap`` (its own draws)."""
    light = [replace(w, id=f"l{i:04d}", meta=RequestMeta(tenant="light"))
             for i, w in enumerate(two_tenants(n=n_light, rate=0.2 * cap, light=1.0, burst=1,
                                               seed=seed))]
    span = max(w.arrival_s for w in light)
    heavy = [replace(w, id=f"h{i:05d}", meta=RequestMeta(tenant="heavy"))
             for i, w in enumerate(two_tenants(n=int(span * load * cap), rate=load * cap,
                                               light=0.0, burst=1, seed=seed + 100))]
    return sorted(light + heavy, key=lambda w: w.arrival_s)


def light_ttft(result: SimResult) -> float:
    """The light tenant's mean TTFT (s)."""
    waits = [r.metrics.first_token_time - r.arrival_time for r in result.finished.values()
             if r.meta.tenant == "light" and r.metrics.first_token_time is not None]
    return sum(waits) / len(waits)


def light_dispatch_waits(result: SimResult) -> list[float]:
    """Each light request's wait from arrival to its first admission (s)."""
    return [r.metrics.first_scheduled_time - r.arrival_time for r in result.finished.values()
            if r.meta.tenant == "light" and r.metrics.first_scheduled_time is not None]


@dataclass
class ServiceRate:
    """The least service rate ``a`` of Theorem 4.11, measured: the weighted service
    (``w_p`` per prompt token, ``w_q`` per output token) per second over each full
    ``window_s`` of virtual time in which some request waited at every step; the least
    of those windows."""

    window_s: float = 1.0
    rates: list[float] = field(default_factory=list)
    _start: float | None = None
    _service: float = 0.0

    def on_step(self, core: Any, feedback: StepFeedback) -> None:
        if not core.waiting:
            self._start, self._service = None, 0.0  # the window breaks
            return
        if self._start is None:
            self._start, self._service = feedback.end_time - feedback.duration_s, 0.0
        self._service += (PROMPT_WEIGHT * feedback.num_prefill_tokens
                          + OUTPUT_WEIGHT * sum(feedback.num_emitted_tokens))
        if feedback.end_time - self._start >= self.window_s:
            self.rates.append(self._service / (feedback.end_time - self._start))
            self._start, self._service = None, 0.0

    def least(self) -> float:
        return min(self.rates)


def dispatch_bound(rate: float, tenants: int = 2) -> float:
    """Theorem 4.11 (Sheng et al., OSDI 2024): a request is dispatched within
    2(n-1)U/a, U = max(w_p * L_input, w_q * M), M the tokens the KV cache holds."""
    tokens = CONFIG.kv_blocks * CONFIG.block_size
    u = max(PROMPT_WEIGHT * MAX_PROMPT, OUTPUT_WEIGHT * tokens)
    return 2 * (tenants - 1) * u / rate
