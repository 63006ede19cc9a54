"""Dashboard frames: a step snapshot plus tokens/s and latency percentiles, as the page's JSON."""

from __future__ import annotations

from collections import deque
from typing import Any

from aioserve.engine.observation import StepSnapshot
from aioserve.reports.stats import percentile
from aioserve.request import Request

#: Percentiles the page shows.
PERCENTILES = (50, 90, 99)
#: Most tenants the page breaks down (by requests in the engine).
MAX_TENANTS = 16


class LatencyWindow:
    """TTFT and inter-token latency (seconds) of the last ``size`` finished requests."""

    def __init__(self, size: int = 500) -> None:
        self.ttft: deque[float] = deque(maxlen=size)
        self.itl: deque[float] = deque(maxlen=size)

    def record(self, request: Request) -> None:
        m = request.metrics
        if m.first_token_time is not None:
            self.ttft.append(max(0.0, m.first_token_time - m.arrival_time))
        n = request.num_output_tokens
        if n > 1 and m.first_token_time is not None and m.last_token_time is not None:
            self.itl.append(max(0.0, m.last_token_time - m.first_token_time) / (n - 1))

    def summary(self) -> dict[str, dict[str, float] | None]:
        """``{"ttft": {"p50": s, "p90": s, "p99": s} | None, "itl": ...}`` in seconds."""
        def of(values: deque[float]) -> dict[str, float] | None:
            if not values:
                return None
            data = list(values)
            return {f"p{q}": round(percentile(data, q) or 0.0, 6) for q in PERCENTILES}

        return {"ttft": of(self.ttft), "itl": of(self.itl)}


class RateMeter:
    """Output tokens per second over the last ``window`` seconds of the engine clock."""

    def __init__(self, window: float = 2.0) -> None:
        self.window = window
        self._points: deque[tuple[float, int]] = deque()

    def add(self, time: float, tokens: int) -> float:
        """Add a (clock, cumulative tokens) point; returns tokens/s (0 until time has passed)."""
        points = self._points
        if points and tokens < points[-1][1]:
            points.clear()  # the counter restarted (a new engine)
        points.append((time, tokens))
        while len(points) > 2 and points[1][0] <= time - self.window:
            points.popleft()
        (t0, n0), (t1, n1) = points[0], points[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


class FrameMaker:
    """Turns snapshots into dashboard frames (``model``: the name shown on the page)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.latencies = LatencyWindow()
        self.by_tenant: dict[str | None, LatencyWindow] = {}
        self.rate = RateMeter()

    def record_finished(self, request: Request) -> None:
        """Add a finished request to the latency windows (its tenant's: the first MAX_TENANTS)."""
        self.latencies.record(request)
        tenant = request.meta.tenant
        window = self.by_tenant.get(tenant)
        if window is None and len(self.by_tenant) < MAX_TENANTS:
            window = self.by_tenant[tenant] = LatencyWindow(100)
        if window is not None:
            window.record(request)

    def frame(self, snapshot: StepSnapshot,
              report: dict[str, float | dict[str, float]] | None = None) -> dict[str, Any]:
        """The frame of one snapshot (call in time order: it advances the rate), with the
        policy's ``report`` (``Scheduler.report()``) as ``policy_report``."""
        frame = snapshot.to_json()
        frame["type"] = "frame"
        frame["model"] = self.model
        frame["tokens_per_s"] = round(
            self.rate.add(snapshot.time, snapshot.num_generated_tokens), 3)
        frame.update(self.latencies.summary())
        frame["tenants"] = [
            [tenant, running, waiting,
             (w.summary()["ttft"] if (w := self.by_tenant.get(tenant)) else None)]
            for tenant, running, waiting in snapshot.tenants[:MAX_TENANTS]]
        frame["policy_report"] = {  # a label's entries: the first MAX_TENANTS
            name: dict(list(value.items())[:MAX_TENANTS]) if isinstance(value, dict) else value
            for name, value in (report or {}).items()}
        return frame
