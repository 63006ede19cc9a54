"""Per-tenant and per-priority metrics, their label values bounded: the first
``max_values`` distinct values get their own label, later ones count under ``other``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from aioserve.request import Request


class BoundedLabels:
    """Label values of one kind, at most ``max_values`` distinct ones plus ``other``."""

    def __init__(self, max_values: int) -> None:
        self.max_values = max_values
        self.seen: set[str] = set()

    def __call__(self, value: object) -> str:
        label = "none" if value is None else str(value)
        if label in self.seen:
            return label
        if len(self.seen) >= self.max_values:
            return "other"
        self.seen.add(label)
        return label


class TenantMetrics:
    """Finished requests, output tokens and TTFT by tenant and priority, in ``registry``."""

    def __init__(self, prefix: str, registry: CollectorRegistry, buckets: tuple[float, ...],
                 max_tenants: int = 64, max_priorities: int = 16) -> None:
        self.tenant = BoundedLabels(max_tenants)
        self.priority = BoundedLabels(max_priorities)
        labels = ["tenant", "priority"]
        self.requests = Counter(
            prefix + "tenant_requests", "Finished requests by tenant, priority and reason.",
            [*labels, "finished_reason"], registry=registry)
        self.generation_tokens = Counter(
            prefix + "tenant_generation_tokens",
            "Output tokens of finished requests by tenant and priority.", labels,
            registry=registry)
        self.ttft = Histogram(
            prefix + "tenant_time_to_first_token_seconds",
            "Arrival to first token by tenant and priority (seconds).", labels,
            buckets=buckets, registry=registry)

    def record(self, request: Request, time_to_first_token: float | None) -> None:
        """Count a finished request under its tenant and priority."""
        tenant = self.tenant(request.meta.tenant)
        priority = self.priority(request.meta.priority)
        reason = request.finish_reason.value if request.finish_reason is not None else "unknown"
        self.requests.labels(tenant, priority, reason).inc()
        self.generation_tokens.labels(tenant, priority).inc(request.num_output_tokens)
        if time_to_first_token is not None:
            self.ttft.labels(tenant, priority).observe(time_to_first_token)
