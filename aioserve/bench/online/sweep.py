"""The capacity search against a live server (``bench serve --sweep-rate``)."""

from __future__ import annotations

import math
from typing import Any

from aioserve.bench.online.metrics import meets_slo
from aioserve.bench.online.serving import run_serving, send_times
from aioserve.bench.online.workload_file import workload_requests
from aioserve.sim.capacity import Curve, run_point, sweep_spec


async def live_sweep(base_url: str, spec: str, rates: list[float], repeats: int, *,
                     vocab_size: int, slo_ttft_ms: float, slo_tpot_ms: float,
                     label: str = "server", **serving: Any) -> Curve:
    """The server's curve: ``repeats`` runs at each rate of the workloads
    :func:`~aioserve.sim.capacity.sweep_spec` makes (those a simulated sweep runs), counted
    by the same rule; ``serving``: :func:`run_serving`'s options."""
    curve = Curve(label, rates)
    for rate in rates:
        points = []
        for repeat in range(repeats):
            requests = workload_requests(sweep_spec(spec, rate, repeat), vocab_size)
            records, _, _ = await run_serving(base_url, requests, **serving)
            times = send_times(requests, math.inf, 0)
            points.append(run_point(rate, [(t, meets_slo(r, slo_ttft_ms, slo_tpot_ms))
                                           for t, r in zip(times, records)]))
        curve.runs.append(points)
    return curve
