"""``GET /metrics``: Prometheus metrics with vLLM's names under the ``aioserve:`` prefix;
gauges read when scraped, per-request histograms recorded when a request finishes, each
generated token counted once."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from aioserve.engine import AsyncEngine
from aioserve.engine.admission import REFUSAL_REASONS
from aioserve.engine.core import EngineCore
from aioserve.engine.observation import StepSnapshot
from aioserve.request import Request, RequestMetrics
from aioserve.server.policy_report import policy_report
from aioserve.server.tenant_labels import BoundedLabels, TenantLabels

PREFIX = "aioserve:"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                30.0, 40.0, 50.0, 60.0, 120.0, 240.0)
_LENGTH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class TenantMetrics:
    """Finished requests, output tokens and TTFT by tenant and priority, in ``registry``."""

    def __init__(self, prefix: str, registry: CollectorRegistry, buckets: tuple[float, ...],
                 tenant: TenantLabels | None = None, max_priorities: int = 16) -> None:
        self.tenant = tenant if tenant is not None else TenantLabels()
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


@dataclass(frozen=True)
class RequestLatencies:
    """One finished request's latencies in seconds (TTFT and queue time from arrival,
    E2E, mean TPOT with two tokens or more); None where undefined."""

    time_to_first_token: float | None
    queue_time: float | None
    e2e: float | None
    time_per_output_token: float | None

    @classmethod
    def of(cls, metrics: RequestMetrics, num_output_tokens: int) -> RequestLatencies:
        """The latencies of a finished request's timestamps."""
        arrival = metrics.arrival_time

        def since(t: float | None) -> float | None:
            return None if t is None else max(0.0, t - arrival)

        tpot = None
        first, last = metrics.first_token_time, metrics.last_token_time
        if num_output_tokens > 1 and first is not None and last is not None:
            tpot = max(0.0, last - first) / (num_output_tokens - 1)
        return cls(since(first), since(metrics.first_scheduled_time),
                   since(metrics.finished_time), tpot)


def _core_counts(core: EngineCore) -> dict[str, int]:
    """The engine's counters that outlive its core (kept by :meth:`ServerMetrics.detach`)."""
    return {"num_preemptions": core.num_preemptions,
            "prefix_cache_queries": core.prefix_cache_queries,
            "prefix_cache_hits": core.prefix_cache_hits,
            "scheduler_failures": core.guard.failures, "num_requests_shed": core.num_shed,
            **core.admission.refused}


class _EngineCollector(Collector):
    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        engine = m.engine
        core = engine.core if engine.is_running else None
        live = list(core.requests.values()) if core is not None else []
        running = len(core.running) if core is not None else 0
        waiting = len(core.waiting) if core is not None else 0
        gauges = (
            ("num_requests_running", "Requests in the running batch.", running),
            ("num_requests_waiting", "Requests waiting for a slot.", waiting),
            ("kv_cache_usage_perc", "KV-cache usage, 0 to 1.",
             core.blocks.usage if core is not None else 0.0),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:  # scraped off the event loop (a test's registry read)
            tasks = None
        if tasks is not None:
            yield GaugeMetricFamily(PREFIX + "asyncio_tasks", "asyncio tasks alive in the "
                                    "server's event loop (a leak shows as growth).", value=tasks)
        threads = engine.runner_info().threads
        if threads is not None:
            yield GaugeMetricFamily(
                PREFIX + "cpu_threads", "Intra-op CPU threads the model's forward runs on "
                "now (the thread governor's choice, or the fixed count).", value=threads)
        counts = {**(_core_counts(core) if core is not None else m.last),
                  "prompt_tokens": m.finished_prompt_tokens + sum(
                      r.num_prompt_tokens for r in live),
                  "generation_tokens": m.finished_generation_tokens + sum(
                      r.num_output_tokens for r in live)}
        counters = (
            ("prompt_tokens", "Prompt tokens of accepted requests."),
            ("generation_tokens", "Generated tokens (each counted once)."),
            ("num_preemptions", "Preemptions (recompute)."),
            ("prefix_cache_queries", "Tokens looked up in the prefix cache at admission."),
            ("prefix_cache_hits", "Tokens found in the prefix cache at admission."),
            ("scheduler_failures", "Policy calls that raised or returned a malformed "
             "decision (contained: the FCFS decision was used, or the hook skipped)."),
            ("num_requests_shed", "Requests the scheduling policy shed (HTTP 503)."),
        )
        for name, doc in counters:
            yield CounterMetricFamily(PREFIX + name, doc, value=counts.get(name, 0))
        refused = CounterMetricFamily(
            PREFIX + "num_requests_refused", "Requests the admission limit refused (HTTP "
            "429), by reason: queue_full (--max-waiting), queue_timeout (--max-queue-time-s).",
            labels=["reason"])
        for reason in REFUSAL_REASONS:
            refused.add_metric([reason], counts.get(reason, 0))
        yield refused
        yield from m.policy_families(core)


class ServerMetrics:
    """The metrics of one app, in its own ``CollectorRegistry``; :meth:`attach` listens
    to ``engine``. ``tenant_labels`` is the app's one tenant-label rule: every series
    keyed by tenant (here and a policy's report) takes its label from it."""

    def __init__(self, engine: AsyncEngine, tenant_labels: TenantLabels | None = None) -> None:
        self.engine = engine
        self.tenant_labels = tenant_labels if tenant_labels is not None else TenantLabels()
        self.registry = CollectorRegistry()
        self.finished_prompt_tokens = 0
        self.finished_generation_tokens = 0
        self.last: dict[str, int] = {}  # _core_counts of the last core, once it stopped
        r = self.registry
        self.request_success = Counter(
            PREFIX + "request_success", "Finished requests by finish reason.",
            ["finished_reason"], registry=r)
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds", "Arrival to first token (seconds).",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Gap between output tokens (seconds); a request's mean gap, once per gap.",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(
            PREFIX + "request_time_per_output_token_seconds",
            "Mean gap between output tokens per request (seconds).",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds", "Arrival to finish (seconds).",
            buckets=_E2E_BUCKETS, registry=r)
        self.queue_time = Histogram(
            PREFIX + "request_queue_time_seconds", "Arrival to first scheduled (seconds).",
            buckets=_E2E_BUCKETS, registry=r)
        self.tenants = TenantMetrics(PREFIX, r, _LATENCY_BUCKETS, self.tenant_labels)
        self.output_length = Histogram(
            PREFIX + "request_output_length_tokens", "Output tokens of requests the policy "
            "predicted, as predicted at arrival and as generated.", ["source"],
            buckets=_LENGTH_BUCKETS, registry=r)
        self.length_error = Histogram(
            PREFIX + "output_length_prediction_error_tokens",
            "|predicted - generated| output tokens per request the policy predicted.",
            buckets=_LENGTH_BUCKETS, registry=r)
        r.register(_EngineCollector(self))
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_open_fds, ...

    def policy_families(self, core: EngineCore | None) -> Iterator[Metric]:
        """The policy's report as ``policy_report{policy, name, key}`` (a value keyed by
        tenant labelled by the tenant rule, values beyond its bound summed under its
        ``other``), preemptions and shed requests by policy, and the waiting queue by
        priority."""
        policy, report = policy_report(self.engine)
        gauge = GaugeMetricFamily(
            PREFIX + "policy_report", "The scheduling policy's report() (docs/schedulers.md): "
            "name is the report's entry, key its label (empty for a plain number).",
            labels=["policy", "name", "key"])
        tenant_keyed = core.scheduler.report_tenant_keys if core is not None else frozenset()
        for name, value in sorted(report.items()):
            if not isinstance(value, dict):
                gauge.add_metric([policy, name, ""], value)
                continue
            values: dict[str, float] = {}
            for key, number in value.items():
                label = self.tenants.tenant(key or None) if name in tenant_keyed else key
                values[label] = values.get(label, 0.0) + number
            for label, number in sorted(values.items()):
                gauge.add_metric([policy, name, label], number)
        yield gauge
        if core is None:
            return
        for name, doc, value in (
                ("policy_preemptions", "Preemptions by scheduling policy.", core.num_preemptions),
                ("policy_shed_requests", "Requests shed by scheduling policy.", core.num_shed)):
            family = CounterMetricFamily(PREFIX + name, doc, labels=["policy"])
            family.add_metric([policy], value)
            yield family
        waiting = GaugeMetricFamily(PREFIX + "num_requests_waiting_by_priority",
                                    "Requests waiting for a slot, by priority.",
                                    labels=["priority"])
        counts: dict[str, int] = {}
        for request in core.waiting:
            label = self.tenants.priority(request.meta.priority)
            counts[label] = counts.get(label, 0) + 1
        for label, count in sorted(counts.items()):
            waiting.add_metric([label], count)
        yield waiting

    def attach(self) -> None:
        """Listen to the engine's finished requests."""
        self.engine.add_listener(self, step_interval=None)

    def on_step(self, snapshot: StepSnapshot) -> None:
        """Unused: gauges are read from the engine when scraped."""

    def on_finish(self, request: Request) -> None:
        """Engine listener: count a finished request's tokens and observe its latencies."""
        self.finished_prompt_tokens += request.num_prompt_tokens
        self.finished_generation_tokens += request.num_output_tokens
        reason = request.finish_reason.value if request.finish_reason is not None else "unknown"
        self.request_success.labels(finished_reason=reason).inc()
        lat = RequestLatencies.of(request.metrics, request.num_output_tokens)
        for histogram, value in ((self.ttft, lat.time_to_first_token),
                                 (self.queue_time, lat.queue_time), (self.e2e, lat.e2e)):
            if value is not None:
                histogram.observe(value)
        self.tenants.record(request, lat.time_to_first_token)
        self.record_prediction(request)
        if lat.time_per_output_token is not None:
            self.tpot.observe(lat.time_per_output_token)
            for _ in range(request.num_output_tokens - 1):
                self.itl.observe(lat.time_per_output_token)

    def record_prediction(self, request: Request) -> None:
        """Observe the policy's predicted and the true length, where it predicted one (its
        declared ``Scheduler.outcomes``)."""
        core = self.engine.core
        outcomes = core.scheduler.outcomes if core is not None else ()
        if not outcomes:
            return
        for request_id, predicted, true in itertools.islice(reversed(outcomes), 8):
            if request_id == request.request_id:
                self.output_length.labels(source="predicted").observe(predicted)
                self.output_length.labels(source="actual").observe(true)
                self.length_error.observe(abs(predicted - true))
                return

    def detach(self) -> None:
        """Stop listening."""
        self.engine.remove_listener(self)
        if self.engine.core is not None:
            self.last = _core_counts(self.engine.core)

    def exposition(self) -> bytes:
        """The metrics in Prometheus text format."""
        return generate_latest(self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        """``GET /metrics``."""
        response = web.Response(body=self.exposition())
        response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        response.charset = "utf-8"
        return response
