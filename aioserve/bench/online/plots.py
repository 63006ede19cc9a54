"""Plots of a serving run: latency distributions and arrivals (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from aioserve.bench.online.serving import RequestRecord


def plot_serving(records: list[RequestRecord], path: str | Path, title: str = "") -> Path:
    """Save a 2x2 figure: TTFT, TPOT and ITL histograms (ms), and each request's
    start-to-end span over time. Returns the path written (PNG, SVG or PDF by suffix).

    Raises:
        ImportError: matplotlib is not installed (``pip install 'aioserve[plots]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in records if r.ok]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    series = {
        "TTFT (ms)": [r.ttft * 1000 for r in done],
        "TPOT (ms)": [t * 1000 for r in done if (t := r.tpot) is not None],
        "ITL (ms)": [g * 1000 for r in done for g in r.itl],
    }
    for ax, (label, values) in zip(axes.flat, series.items()):
        ax.hist(values, bins=40, color="tab:blue", alpha=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("count")
    ax = axes.flat[3]
    if done:
        origin = min(r.start for r in done)
        for i, r in enumerate(sorted(done, key=lambda r: r.start)):
            ax.plot([r.start - origin, r.end - origin], [i, i], color="tab:green", lw=1)
            ax.plot([r.chunk_times[0] - origin], [i], "k.", ms=2)
    ax.set_xlabel("time (s): request span, dot = first token")
    ax.set_ylabel("request")
    fig.suptitle(title or "aioserve bench serve")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
