"""Plots of a serving run: latency distributions and arrivals (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aioserve.reports.compare import save_figure
from aioserve.reports.outcome import Outcome


def run_title(source: str, send_times: list[float], endpoint: str) -> str:
    """A title naming the workload run: ``source`` and the mean arrival rate of ``send_times``."""
    span = max(send_times, default=0.0) - min(send_times, default=0.0)
    count = len(send_times)
    rate = ("all at once" if span <= 0 or count < 2
            else f"{(count - 1) / span:.2f} req/s mean arrival rate")
    return f"{source}: {count} requests, {rate}, {endpoint}"


def _bins(values: list[float]) -> int:
    """40 bins, or one where the values are all but equal (numpy cannot split rounding errors)."""
    return 40 if values and max(values) - min(values) > 1e-6 else 1


def serving_figure(records: list[Outcome], title: str = "") -> Any:
    """A 2x2 Figure: TTFT, TPOT and ITL histograms (ms) and each request's span."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in records if r.ok]
    tenants = sorted({r.tenant or "-" for r in done})
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ttft_ax = axes.flat[0]
    if len(tenants) > 1:
        ttft_ax.hist([[(r.ttft or 0.0) * 1000 for r in done if (r.tenant or "-") == tenant]
                      for tenant in tenants], bins=_bins([(r.ttft or 0.0) * 1000 for r in done]),
                     stacked=True, label=tenants)
        ttft_ax.legend(title="tenant", fontsize=7)
    else:
        ttfts = [(r.ttft or 0.0) * 1000 for r in done]
        ttft_ax.hist(ttfts, bins=_bins(ttfts), color="tab:blue", alpha=0.8)
    ttft_ax.set_xlabel("TTFT (ms)")
    series = {
        "TPOT (ms)": [t * 1000 for r in done if (t := r.tpot) is not None],
        "ITL (ms): gaps between reads that carried tokens": [
            g * 1000 for r in done for g in r.itl],
    }
    for ax, (label, values) in zip(axes.flat[1:3], series.items()):
        ax.hist(values, bins=_bins(values), color="tab:blue", alpha=0.8)
        ax.set_xlabel(label)
    for ax in axes.flat[:3]:
        ax.set_ylabel("requests" if ax is not axes.flat[2] else "gaps")
        ax.set_xlim(left=0)
    ax = axes.flat[3]
    if done:
        origin = min(r.arrival_s for r in done)
        colors = {tenant: f"C{i}" for i, tenant in enumerate(tenants)}
        for i, r in enumerate(sorted(done, key=lambda r: r.arrival_s)):
            ax.plot([r.arrival_s - origin, (r.finish_s or r.arrival_s) - origin], [i, i], lw=1,
                    color=colors[r.tenant or "-"] if len(tenants) > 1 else "tab:green")
            ax.plot([(r.first_token_s or r.arrival_s) - origin], [i], "k.", ms=2)
    ax.set_xlim(left=0)
    ax.set_xlabel("time (s): request span, dot = first token"
                  + (", colour = tenant" if len(tenants) > 1 else ""))
    ax.set_ylabel("request")
    fig.suptitle(title or "aioserve bench serve")
    fig.tight_layout()
    return fig


def plot_serving(records: list[Outcome], path: str | Path, title: str = "") -> Path:
    """Save :func:`serving_figure` (PNG, SVG or PDF by suffix); returns the path."""
    return save_figure(serving_figure(records, title), path)
