"""The capacity search (``simulate --sweep-rate``): runs, a table, a plot and an HTML page."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aioserve.reports.compare import Table, png_of, write_page
from aioserve.reports.figures import outcomes
from aioserve.reports.slo import meets_slo
from aioserve.sim.capacity import Curve, run_point, sweep_spec
from aioserve.sim.simulator import SimConfig, SimResult, simulate
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import load_workload


def met(result: SimResult, slo_ttft_ms: float | None,
        slo_tpot_ms: float | None) -> list[tuple[float, bool]]:
    """(arrival s, met every objective) of each request; rejected ones did not."""
    return [(o.arrival_s, meets_slo(o, slo_ttft_ms, slo_tpot_ms)) for o in outcomes(result)]


async def simulate_sweep(
    spec: str, policies: list[str], rates: list[float], repeats: int,
    config_for: Callable[[list[WorkloadRequest]], SimConfig],
    slo_ttft_ms: float | None, slo_tpot_ms: float | None,
    params: Mapping[str, Mapping[str, Any] | None] | None = None,
) -> list[Curve]:
    """Each policy's curve: ``repeats`` runs at each rate (:func:`sweep_spec` workloads)."""
    workloads = {(rate, i): load_workload(sweep_spec(spec, rate, i))
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
                points.append(run_point(rate, met(result, slo_ttft_ms, slo_tpot_ms)))
            curve.runs.append(points)
        curves.append(curve)
    return curves


def _pm(mean: float, half: float, scale: float = 1.0, digits: int = 1) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean * scale:.{digits}f}" + ("" if math.isnan(half) else
                                           f" ± {half * scale:.{digits}f}")


def sweep_rows(curves: list[Curve], target: float) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: per policy, SLO % and goodput at each rate, then the capacity."""
    rates = curves[0].rates
    headers = ["policy", *(f"{r:.3g}/s" for r in rates), f"capacity @ {target:.0%} (req/s)"]
    rows = []
    for curve in curves:
        cells = [f"{_pm(*a, 100.0, 0)}% / {_pm(*g, 1.0, 2)}"
                 for a, g in zip(curve.figure("attainment"), curve.figure("goodput"))]
        mean, half = curve.capacity_ci(target)
        rows.append([curve.policy, *cells,
                     f"{curve.capacity(target)}" + ("" if math.isnan(half)
                                                    else f" (repeats {_pm(mean, half, 1, 2)})")])
    return headers, rows


def format_sweep(curves: list[Curve], target: float, title: str = "") -> str:
    """The sweep as a text table (cells: SLO attainment % / goodput req/s, mean ± 95% CI)."""
    headers, rows = sweep_rows(curves, target)
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [title] if title else []
    lines.append("cells: SLO attainment % / goodput req/s (mean ± 95% CI over repeats)")
    for index, row in enumerate([headers, *rows]):
        lines.append("  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                               for i, (c, w) in enumerate(zip(row, widths))))
        if index == 0:
            lines.append("-" * len(lines[-1]))
    return "\n".join(lines)


def plot_sweep(curves: list[Curve], target: float, path: str | Path | None = None,
               title: str = "") -> bytes:
    """A PNG: attainment and goodput against rate (95% CI bars), the target and each
    capacity marked; written to ``path`` if given (ValueError without matplotlib)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ValueError(f"plots need matplotlib: pip install 'aioserve[plots]' ({exc})") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for curve in curves:
        attained, goodput = curve.figure("attainment"), curve.figure("goodput")
        line = left.errorbar(curve.rates, [m * 100 for m, _ in attained],
                             [0 if math.isnan(h) else h * 100 for _, h in attained],
                             marker="o", capsize=3, label=curve.policy)
        found = curve.capacity(target)
        if not found.bound:
            left.axvline(found.rate, color=line[0].get_color(), linestyle=":", linewidth=1)
        right.errorbar(curve.rates, [m for m, _ in goodput],
                       [0 if math.isnan(h) else h for _, h in goodput],
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
    headers, rows = sweep_rows(curves, target)
    table = Table("SLO attainment % / goodput req/s, mean ± 95% CI over repeats", headers, rows)
    return write_page(path, title, note, [table], lambda: plot_sweep(curves, target))
