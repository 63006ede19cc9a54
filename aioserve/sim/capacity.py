"""Capacity from a rate sweep: SLO attainment and goodput against request rate, and the
highest rate whose attainment meets a target (DistServe, Zhong et al., OSDI'24).

Warm-up and drain are excluded by one rule: a run counts only the requests whose arrivals
are the middle 80% (the first and last 10% of arrivals run but are not counted). A run's
attainment is the fraction of counted requests that met every objective; its goodput, that
fraction times the counted requests' offered rate (``(n - 1) / span`` of their arrivals).
Capacity: the curve is walked from the lowest rate; at the first rate whose attainment falls
below the target, the rate is interpolated linearly between it and the rate before. Repeats
(seeds of a synthetic workload, consecutive windows of a trace) give each figure a 95%
confidence interval, mean +- t(0.975, k - 1) s / sqrt(k)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aioserve.workloads.trace_options import split_spec

#: Fraction of arrivals counted, from the middle of a run.
MEASURED_FRACTION = 0.8

#: t(0.975, df) for df = 1..30 (two-sided 95%); beyond, the normal 1.96.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student's t quantile 0.975 with ``df`` >= 1 degrees of freedom."""
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% CI (NaN with fewer than two values)."""
    if not values:
        return math.nan, math.nan
    if len(values) < 2:
        return values[0], math.nan
    return statistics.fmean(values), t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(
        len(values))


def measured(outcomes: Sequence[tuple[float, bool]]) -> list[tuple[float, bool]]:
    """The (arrival s, met its SLO) pairs counted: the middle ``MEASURED_FRACTION`` by arrival."""
    ordered = sorted(outcomes, key=lambda o: o[0])
    cut = math.floor(len(ordered) * (1 - MEASURED_FRACTION) / 2 + 1e-9)
    return ordered[cut: len(ordered) - cut] or ordered


@dataclass(frozen=True)
class RunPoint:
    """One run at one rate: attainment (0-1), goodput (req/s), counted requests."""

    rate: float
    attainment: float
    goodput: float
    counted: int


def run_point(rate: float, outcomes: Sequence[tuple[float, bool]]) -> RunPoint:
    """A run's figures by the module's rule (``rate``: the nominal one, for an instant window)."""
    counted = measured(outcomes)
    if not counted:
        return RunPoint(rate, math.nan, math.nan, 0)
    attainment = sum(good for _, good in counted) / len(counted)
    span = counted[-1][0] - counted[0][0]
    offered = (len(counted) - 1) / span if span > 0 else rate
    return RunPoint(rate, attainment, attainment * offered, len(counted))


@dataclass(frozen=True)
class Capacity:
    """The highest rate meeting the target; ``bound``: "" found, "<" below the lowest rate
    swept (``rate`` is that rate), ">=" met at every rate (``rate`` is the highest)."""

    rate: float
    bound: str = ""

    def __str__(self) -> str:
        return f"{self.bound}{self.rate:.3g}"


def capacity(rates: Sequence[float], attainments: Sequence[float], target: float) -> Capacity:
    """The module's capacity of one curve (rates ascending)."""
    for index, (rate, attained) in enumerate(zip(rates, attainments)):
        if attained >= target:
            continue
        if index == 0:
            return Capacity(rate, "<")
        low, before = rates[index - 1], attainments[index - 1]
        return Capacity(low + (before - target) / (before - attained) * (rate - low))
    return Capacity(rates[-1], ">=")


@dataclass
class Curve:
    """One policy's sweep: each rate's runs (one per repeat)."""

    policy: str
    rates: list[float]
    runs: list[list[RunPoint]] = field(default_factory=list)

    def figure(self, name: str) -> list[tuple[float, float]]:
        """(mean, CI half-width) of ``attainment`` or ``goodput`` at each rate."""
        return [mean_ci([getattr(p, name) for p in points]) for points in self.runs]

    def capacity(self, target: float) -> Capacity:
        """The capacity of the mean attainment curve."""
        return capacity(self.rates, [m for m, _ in self.figure("attainment")], target)

    def capacity_ci(self, target: float) -> tuple[float, float]:
        """Mean and 95% CI half-width of each repeat's own capacity."""
        repeats = min(len(points) for points in self.runs)
        return mean_ci([capacity(self.rates, [points[i].attainment for points in self.runs],
                                 target).rate for i in range(repeats)])

    def to_dict(self, target: float) -> dict[str, Any]:
        return {"policy": self.policy, "rates": self.rates, "target": target,
                "capacity": str(self.capacity(target)),
                "capacity_ci": self.capacity_ci(target),
                "attainment": self.figure("attainment"), "goodput": self.figure("goodput"),
                "runs": [[vars(p) for p in points] for points in self.runs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Curve:
        return cls(data["policy"], list(data["rates"]),
                   [[RunPoint(**p) for p in points] for points in data["runs"]])


def parse_rates(text: str) -> list[float]:
    """``LO:HI[:N]`` as N (default 5; 1 when LO = HI) rates from LO to HI, evenly spaced;
    ValueError if not."""
    parts = text.split(":")
    try:
        low, high = float(parts[0]), float(parts[1])
        count = int(parts[2]) if len(parts) == 3 else 1 if low == high else 5
    except (IndexError, ValueError):
        raise ValueError(f"--sweep-rate: expected LO:HI[:N], got {text!r}") from None
    if len(parts) > 3 or not 0 < low <= high < math.inf or count < 1:
        raise ValueError(f"--sweep-rate: expected LO:HI[:N] with 0 < LO <= HI and N >= 1, "
                         f"got {text!r}")
    if (count == 1) != (low == high):
        raise ValueError(f"--sweep-rate: {count} rate{'s' * (count > 1)} from {low:g} to "
                         f"{high:g}: N is 1 exactly when LO = HI, got {text!r}")
    if count == 1:
        return [low]
    return [round(low + (high - low) * i / (count - 1), 6) for i in range(count)]


def sweep_spec(spec: str, rate: float, repeat: int) -> str:
    """The workload of one run: ``spec`` at ``rate``, repeat ``repeat`` (a file's next window,
    a synthetic workload's next seed); ValueError for a workload without a rate."""
    name, text = (spec, "") if Path(spec).exists() else split_spec(spec)
    options = dict(part.partition("=")[::2] for part in text.split(",") if part)
    if Path(name).exists():
        if repeat and "n" not in options and "duration" not in options:
            raise ValueError("--sweep-repeats: repeats of a file take its next windows: give "
                             "the window's n= or duration=")
        options.pop("speed", None)
        options["window"] = str(int(options.get("window", 0)) + repeat)
    elif name.startswith("article-"):
        raise ValueError(f"--sweep-rate: workload {name!r} has no arrival rate to sweep")
    else:
        options["seed"] = str(int(options.get("seed", 0)) + repeat)
    options["rate"] = f"{rate:g}"
    return f"{name}:" + ",".join(f"{k}={v}" for k, v in options.items())
