"""The outcome of one request, the one record a simulated and a live request both become."""

from __future__ import annotations

from dataclasses import dataclass, replace

from aioserve.request import Request
from aioserve.workloads.request import WorkloadRequest


@dataclass(frozen=True)
class Outcome:
    """What happened to one request of a workload (times in seconds on the run's clock, whose
    zero is the workload's; lengths in tokens).

    Attributes:
        arrival_s: when it joined (simulated) or was sent (live).
        first_token_s, last_token_s, finish_s: None where it never got that far.
        first_scheduled_s: when a step first ran it (simulated runs; None live).
        error: why it failed or was rejected (None: it finished).
        token_times: when each read carrying tokens arrived (live runs: the ITL; empty in a
            simulation, which has no network).
        tenant, priority, ttft_slo_ms, tpot_slo_ms, deadline_s: the request's own, from its
            workload row."""

    id: str
    arrival_s: float
    prompt_len: int
    output_tokens: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    first_scheduled_s: float | None = None
    error: str | None = None
    cached_tokens: int = 0
    preemptions: int = 0
    tenant: str | None = None
    priority: int = 0
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    deadline_s: float | None = None
    token_times: tuple[float, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether it finished without error (and had a first token)."""
        return self.error is None and self.first_token_s is not None and self.finish_s is not None

    @property
    def ttft(self) -> float | None:
        """Time to first token: first token - arrival (s)."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e(self) -> float | None:
        """End to end: finish - arrival (s)."""
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first (None with fewer than two)."""
        if self.output_tokens < 2 or self.first_token_s is None or self.last_token_s is None:
            return None
        return (self.last_token_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        """Gaps between reads that carried tokens (live runs only)."""
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:])]


def of_item(item: WorkloadRequest) -> Outcome:
    """An outcome of ``item`` with nothing happened yet: its own fields from its workload row."""
    meta = item.meta
    return Outcome(item.id, item.arrival_s, item.prompt_len, tenant=meta.tenant,
                   priority=meta.priority, ttft_slo_ms=meta.ttft_slo_ms,
                   tpot_slo_ms=meta.tpot_slo_ms, deadline_s=item.deadline_s)


def simulated(item: WorkloadRequest, request: Request | None, reason: str | None) -> Outcome:
    """A simulated (or in-process replayed) request's outcome: its engine request's metrics
    if it finished, else ``reason`` (rejected, or never finished)."""
    if request is None:
        return replace(of_item(item), error=reason or "never finished")
    m = request.metrics
    failed = request.finish_reason is not None and request.finish_reason.value == "error"
    return replace(of_item(item), output_tokens=request.num_output_tokens,
                   first_token_s=m.first_token_time, last_token_s=m.last_token_time,
                   finish_s=m.finished_time, first_scheduled_s=m.first_scheduled_time,
                   error="error" if failed else None, cached_tokens=request.num_cached_tokens,
                   preemptions=m.num_preemptions)
