"""A policy's ``report()`` over a simulation's virtual time (``simulate --report``): each of
its numbers as a series, their summary table and their figure."""

from __future__ import annotations

import logging
import math
from typing import Any

from aioserve.reports.compare import Table, png_of

log = logging.getLogger(__name__)

#: most points a series keeps (older ones thinned to every other when it fills)
MAX_POINTS = 2000


class PolicySeries:
    """Samples the running policy's ``report()`` after every step of a simulation
    (``simulate(..., on_step=series.on_step)``). Each finite number becomes a series named
    by its key, or ``key.entry`` inside a keyed value (a tenant's counter, a level's
    occupancy): ``{name: [(virtual time s, value), ...]}``. A report() that raises
    stops the sampling (logged once); the run goes on."""

    def __init__(self) -> None:
        self.series: dict[str, list[tuple[float, float]]] = {}
        self.stride = 1  # steps per sample: doubles each time MAX_POINTS is reached
        self.steps = 0
        self.failed = False

    def on_step(self, core: Any, feedback: Any) -> None:
        """The simulator's step hook: sample ``core.scheduler.report()`` at the step's end."""
        self.steps += 1
        if self.failed or self.steps % self.stride:
            return
        try:
            report = core.scheduler.report()
        except Exception:  # a user's policy: its report() must not end the run
            log.exception("report() raised: its series stop here")
            self.failed = True
            return
        for name, value in flatten(report).items():
            points = self.series.setdefault(name, [])
            points.append((float(feedback.end_time), value))
        if any(len(points) >= MAX_POINTS for points in self.series.values()):
            self.stride *= 2
            for name, points in self.series.items():
                self.series[name] = points[::2]


def flatten(report: Any) -> dict[str, float]:
    """A report's finite numbers by name (``key`` or ``key.entry``); anything else left out."""
    out: dict[str, float] = {}
    if not isinstance(report, dict):
        return out
    for key, value in report.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for entry, number in items:
            if isinstance(number, (int, float)) and math.isfinite(number):
                out[str(key) if entry is None else f"{key}.{entry}"] = float(number)
    return out


def series_table(runs: dict[str, PolicySeries]) -> Table:
    """One row per policy and series: samples, first and last time, last, least, most."""
    rows = []
    for policy, sampled in runs.items():
        for name, points in sorted(sampled.series.items()):
            values = [v for _, v in points]
            rows.append([policy, name, str(len(points)), f"{points[0][0]:.3f}",
                         f"{points[-1][0]:.3f}", f"{values[-1]:.4g}", f"{min(values):.4g}",
                         f"{max(values):.4g}"])
    return Table("policy report() over time",
                 ["policy", "series", "samples", "from s", "to s", "last", "least", "most"],
                 rows)


def series_figure(runs: dict[str, PolicySeries], lines: int = 12) -> Any:
    """A matplotlib figure: one panel per policy with a report, its first ``lines`` series
    against virtual time (ValueError without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError(f"the plots need matplotlib: pip install 'aioserve[plots]' ({exc})"
                         ) from None
    shown = {p: s for p, s in runs.items() if s.series}
    fig, axes = plt.subplots(max(len(shown), 1), 1, figsize=(9, 2.8 * max(len(shown), 1)),
                             squeeze=False)
    for ax, (policy, sampled) in zip(axes[:, 0], shown.items()):
        for name in sorted(sampled.series)[:lines]:
            points = sampled.series[name]
            ax.plot([t for t, _ in points], [v for _, v in points], label=name, lw=1)
        ax.set_title(f"{policy}: report() over time")
        ax.set_xlabel("virtual time (s)")
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    return fig


def series_png(runs: dict[str, PolicySeries]) -> bytes:
    """:func:`series_figure` as PNG bytes (ValueError without matplotlib or any series)."""
    if not any(s.series for s in runs.values()):
        raise ValueError("no policy reported a number")
    return png_of(series_figure(runs))
