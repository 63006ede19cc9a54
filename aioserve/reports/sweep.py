"""The capacity search (``simulate --sweep-rate``): runs, a table, a plot and an HTML page."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from aioserve.reports.compare import Table, format_table, png_of, pyplot, write_page
from aioserve.reports.figures import admission_refusals, outcomes
from aioserve.reports.slo import meets_slo
from aioserve.sim.capacity import INTERVALS, Curve, run_point, sweep_spec
from aioserve.sim.simulator import SimConfig, SimResult, simulate
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import load_workload


def met(result: SimResult, slo_ttft_ms: float | None,
        slo_tpot_ms: float | None) -> list[tuple[float, bool]]:
    """(arrival s, met every objective) of each request; rejected ones did not."""
    return [(o.arrival_s, meets_slo(o, slo_ttft_ms, slo_tpot_ms)) for o in outcomes(result)]


def admission_refused(result: SimResult) -> int:
    """Requests the admission limit refused (``queue_full``, ``queue_timeout``)."""
    return admission_refusals(outcomes(result))


async def simulate_sweep(
    spec: str, policies: list[str], rates: list[float], repeats: int,
    config_for: Callable[[list[WorkloadRequest]], SimConfig],
    slo_ttft_ms: float | None, slo_tpot_ms: float | None,
    params: Mapping[str, Mapping[str, Any] | None] | None = None, redraw: bool = False,
) -> list[Curve]:
    """Each policy's curve: ``repeats`` runs at each rate (:func:`sweep_spec` workloads)."""
    workloads = {(rate, i): load_workload(sweep_spec(spec, rate, i, redraw))
                 for rate in rates for i in range(repeats)}
    curves = []
    for policy in policies:
        curve = Curve(policy, rates)
        for rate in rates:
            points = []
            for i in range(repeats):
                workload = workloads[rate, i]
                result = await simulate(workload, policy, config_for(workload),
                                        scheduler_params=(params or {}).get(policy))
                point = run_point(rate, met(result, slo_ttft_ms, slo_tpot_ms))
                points.append(replace(point, requests=len(workload),
                                      refused=admission_refused(result)))
            curve.runs.append(points)
        curves.append(curve)
    return curves


def sweep_rows(curves: list[Curve], target: float) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: per policy, the capacity first, then mean SLO % / goodput at each
    rate (intervals: ``--json`` and the HTML page)."""
    rates = curves[0].rates
    headers = ["policy", f"capacity @ {target:.0%} (req/s)", *(f"{r:.3g}/s" for r in rates)]
    rows = []
    for curve in curves:
        cells = [f"{a * 100:.0f}% / {g:.2f}" if not math.isnan(a) else "-"
                 for (a, _, _), (g, _, _) in zip(curve.figure("attainment"),
                                                 curve.figure("goodput"))]
        rows.append([curve.policy, str(curve.capacity(target)), *cells])
    return headers, rows


def sweep_notes(curves: list[Curve], target: float) -> list[str]:
    """The lines under the table: each repeat's capacity, bounds said as bounds, and a curve
    whose attainment rises with the rate beyond its intervals."""
    notes = []
    for curve in curves:
        found = curve.capacity(target)
        line = f"{curve.policy}: capacity {found}"
        if found.bound == "<":
            line += f" (a bound: below the lowest rate swept, {curve.rates[0]:g} req/s)"
        elif found.bound == ">=":
            line += f" (a bound: met at every rate swept, up to {curve.rates[-1]:g} req/s)"
        interval = curve.capacity_interval(target)
        notes.append(line + (f"; {interval}" if interval else ""))
        for counts, what in ((curve.refused(), "refused by the admission limit (queue_full, "
                              "queue_timeout)"), (curve.errors(), "errors (neither finished "
                                                  "nor refused)")):
            if any(n for n, _ in counts):
                shares = ", ".join(f"{n / total:.0%} ({n} of {total}) at {rate:.3g}/s"
                                   for rate, (n, total) in zip(curve.rates, counts) if total)
                notes.append(f"{curve.policy}: {what}: {shares}")
        if not curve.monotonic():
            notes.append(f"{curve.policy}: warning: attainment rises with the rate beyond its "
                         "intervals (not monotonic): the runs measured something else too "
                         "(the machine's speed moved, or the windows differ)")
    return notes


def format_sweep(curves: list[Curve], target: float, title: str = "") -> str:
    """The sweep as a text table, answer first (cells: mean SLO attainment % / goodput
    req/s), then the capacity's repeats and warnings."""
    def wrap(text: str) -> str:
        return textwrap.fill(text, 100, subsequent_indent="  ")

    table = format_table(Table("", *sweep_rows(curves, target)))
    lines = [wrap(title)] if title else []
    lines += [wrap("cells: SLO attainment % / goodput req/s (means; intervals in --json and "
                   "--report)"), table, *map(wrap, sweep_notes(curves, target)),
              wrap(f"intervals {INTERVALS}")]
    return "\n".join(lines)


def _bars(figure: list[tuple[float, float, float]], scale: float) -> list[list[float]]:
    """Matplotlib's asymmetric error bars (below, above) of (mean, low, high) figures."""
    return [[0.0 if math.isnan(lo) else max(m - lo, 0.0) * scale for m, lo, _ in figure],
            [0.0 if math.isnan(hi) else max(hi - m, 0.0) * scale for m, _, hi in figure]]


def plot_sweep(curves: list[Curve], target: float, path: str | Path | None = None,
               title: str = "") -> bytes:
    """A PNG: attainment and goodput against rate (95% CI bars), the target and each
    capacity marked; written to ``path`` if given (ValueError without matplotlib)."""
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4))
    for curve in curves:
        attained, goodput = curve.figure("attainment"), curve.figure("goodput")
        line = left.errorbar(curve.rates, [m * 100 for m, _, _ in attained],
                             _bars(attained, 100.0), marker="o", capsize=3, label=curve.policy)
        found = curve.capacity(target)
        if not found.bound:
            left.axvline(found.rate, color=line[0].get_color(), linestyle=":", linewidth=1)
        right.errorbar(curve.rates, [m for m, _, _ in goodput], _bars(goodput, 1.0),
                       marker="o", capsize=3, label=curve.policy)
    left.axhline(target * 100, color="grey", linestyle="--", linewidth=1,
                 label=f"target {target:.0%}")
    left.set(xlabel="request rate (req/s)", ylabel="SLO attainment (%)", ylim=(0, 105),
             title="SLO attainment (dotted: capacity)")
    right.set(xlabel="request rate (req/s)", ylabel="goodput (req/s)", title="goodput")
    right.set_ylim(bottom=0)
    for ax in (left, right):
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return png_of(fig, path)


def write_sweep_html(curves: list[Curve], target: float, path: str | Path, title: str,
                     note: str = "") -> Path:
    """A self-contained page: the table, then the plot (left out without matplotlib)."""
    headers = ["policy", "rate (req/s)", "SLO % [95%]", "goodput req/s [95%]"]
    rows = [[curve.policy, f"{rate:g}", f"{a * 100:.1f} [{alo * 100:.1f}, {ahi * 100:.1f}]",
             f"{g:.2f} [{glo:.2f}, {ghi:.2f}]"]
            for curve in curves
            for rate, (a, alo, ahi), (g, glo, ghi) in zip(
                curve.rates, curve.figure("attainment"), curve.figure("goodput"))]
    table = Table(f"intervals {INTERVALS}", headers, rows)
    note = "\n".join([note, *sweep_notes(curves, target)]).strip()
    return write_page(path, title, note, [Table("capacity", *sweep_rows(curves, target)), table],
                      lambda: plot_sweep(curves, target))
