"""The capacity search against a live server (``aioserve capacity --url``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aioserve.bench.online.serving import run_serving
from aioserve.reports.figures import admission_refusals
from aioserve.reports.slo import meets_slo
from aioserve.sim.capacity import Curve, run_point, sweep_spec
from aioserve.workloads.scenarios import load_workload


async def live_sweep(base_url: str, spec: str, rates: list[float], repeats: int, *,
                     vocab_size: int, slo_ttft_ms: float | None, slo_tpot_ms: float | None,
                     label: str = "server", redraw: bool = False,
                     **serving: Any) -> tuple[Curve, list[float]]:
    """The server's curve: ``repeats`` runs at each rate of the workloads
    :func:`~aioserve.sim.capacity.sweep_spec` makes (those a simulated sweep runs), counted
    by the same rule (a 429 of the server's admission limit counted as refused, any other
    failure as an error; neither meets its objectives), and the TPOTs (s) of the lowest
    rate's finished requests (the machine's speed as measured); ``serving``:
    :func:`run_serving`'s options."""
    curve = Curve(label, rates)
    tpots: list[float] = []
    for rate in rates:
        points = []
        for repeat in range(repeats):
            requests = load_workload(sweep_spec(spec, rate, repeat, redraw))
            outcomes, _, _ = await run_serving(base_url, requests, at_arrivals=True,
                                               vocab_size=vocab_size, **serving)
            point = run_point(rate, [(r.arrival_s, meets_slo(o, slo_ttft_ms, slo_tpot_ms))
                                     for r, o in zip(requests, outcomes)])
            refused = admission_refusals(outcomes)  # 429 from the server's limit
            points.append(replace(point, requests=len(requests), refused=refused,
                                  errors=sum(not o.ok for o in outcomes) - refused))
            if rate == rates[0]:
                tpots += [t for o in outcomes if o.ok and (t := o.tpot) is not None]
        curve.runs.append(points)
    return curve, tpots
