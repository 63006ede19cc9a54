"""Plots of simulations (matplotlib): slot timelines, as the article's table, latency CDFs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aioserve.reports.compare import save_figure
from aioserve.sim.simulator import SimResult

#: (slot, request id, start s, end s): one request's uninterrupted stay in one slot.
Interval = tuple[int, str, float, float]


def slot_intervals(result: SimResult) -> list[Interval]:
    """Which request holds which slot when (lowest free slot on entry, until a step omits it)."""
    holder: dict[str, tuple[int, float, float]] = {}
    intervals: list[Interval] = []
    for step in result.steps:
        current = set(step.request_ids)
        for request_id in [r for r in holder if r not in current]:
            slot, start, end = holder.pop(request_id)
            intervals.append((slot, request_id, start, end))
        for request_id in step.request_ids:
            if request_id in holder:
                slot, start, _ = holder[request_id]
                holder[request_id] = (slot, start, step.end_s)
            else:
                taken = {slot for slot, _, _ in holder.values()}
                slot = next(s for s in range(len(holder) + 1) if s not in taken)
                holder[request_id] = (slot, step.start_s, step.end_s)
    intervals.extend((s, r, a, b) for r, (s, a, b) in holder.items())
    return sorted(intervals, key=lambda i: (i[2], i[0]))


def _gantt(ax: Any, result: SimResult, summary: dict[str, Any]) -> None:
    intervals = slot_intervals(result)
    span = max((end for *_, end in intervals), default=1.0) or 1.0
    import matplotlib

    colors = matplotlib.colormaps["tab20"]
    order = {item.id: index for index, item in enumerate(result.workload)}
    for slot, request_id, start, end in intervals:
        color = colors(order.get(request_id, 0) % 20)
        ax.broken_barh([(start, end - start)], (slot - 0.4, 0.8), color=color, edgecolor="white")
        if end - start > span / 25:
            ax.text((start + end) / 2, slot, request_id, ha="center", va="center", fontsize=7)
    slots = max((s for s, *_ in intervals), default=0) + 1
    ax.set_yticks(range(slots), [f"slot {s}" for s in range(slots)])
    ax.set_ylim(slots - 0.5, -0.5)
    ax.set_xlabel("time (s)")
    mean = summary["mean_latency_s"]
    ax.set_title(f"{summary['scheduler']}: makespan {summary['makespan_s']:.1f} s, "
                 f"mean latency {mean if mean is None else round(mean, 2)} s, "
                 f"{summary['preemptions']} preemptions", fontsize=9)


def _cdf(ax: Any, summaries: list[dict[str, Any]]) -> None:
    for index, summary in enumerate(summaries):
        latencies = sorted(r["latency_s"] for r in summary["requests"] if r["status"] == "finished")
        fractions = [(i + 1) / len(latencies) for i in range(len(latencies))]
        ax.step(latencies, fractions, where="post", label=summary["scheduler"],
                linestyle=("-", "--", "-.", ":")[index % 4])
    ax.set_xlabel("latency (s)")
    ax.set_xlim(left=0)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("fraction of requests")
    ax.set_title("latency CDF", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def timeline_figure(results: list[SimResult], summaries: list[dict[str, Any]],
                    title: str = "") -> Any:
    """One slot timeline per run on one time axis, and for several runs their latency CDF."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(results) + (1 if len(results) > 1 else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(11, 1.2 + 2.4 * rows), squeeze=False)
    timelines = axes[: len(results), 0]
    for ax, result, summary in zip(timelines, results, summaries):
        _gantt(ax, result, summary)
        if ax is not timelines[0]:
            ax.sharex(timelines[0])
    longest = max((float(summary["makespan_s"] or 0.0) for summary in summaries), default=0.0)
    timelines[0].set_xlim(0, 1.02 * longest or 1.0)  # sharing takes the first axis's limits
    if len(results) > 1:
        _cdf(axes[-1, 0], summaries)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot(results: list[SimResult], summaries: list[dict[str, Any]], path: str | Path,
         title: str = "") -> Path:
    """Write :func:`timeline_figure` as an image (format from the suffix); returns the path."""
    return save_figure(timeline_figure(results, summaries, title), path)
