"""Capacity from a rate sweep: SLO attainment and goodput against request rate, and the
highest rate whose attainment meets a target (DistServe, Zhong et al., OSDI'24).

Warm-up and drain are excluded by one rule: a run counts only the requests whose arrivals
are the middle 80% (the first and last 10% of arrivals run but are not counted). A run's
attainment is the fraction of counted requests that met every objective; its goodput, that
fraction times the counted requests' offered rate (``(n - 1) / span`` of their arrivals).
Capacity: the curve is walked from the lowest rate; at the first rate whose attainment falls
below the target, the rate is interpolated linearly between it and the rate before; a curve
that never meets it, or always does, gives a bound (below the lowest rate swept, at least the
highest), never a number. Repeats (seeds of a synthetic workload, consecutive windows of a
trace) give each figure a 95% interval that stays inside what it can be: attainment, Wilson's
score interval over every counted request of the repeats (Wilson, JASA 1927); goodput and the
capacity, a percentile bootstrap over the repeats (2,000 resamples of the repeats' values, so
never below the lowest nor above the highest); a capacity some repeat only bounds is reported
as those bounds, not averaged."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aioserve.workloads.trace_options import split_spec

#: How the intervals are made, as the reports name it.
INTERVALS = ("95%: attainment Wilson over counted requests; goodput and capacity bootstrap "
             "over repeats")

#: Fraction of arrivals counted, from the middle of a run.
MEASURED_FRACTION = 0.8

#: The normal quantile of a two-sided 95% interval.
Z975 = 1.959964
#: Bootstrap resamples of an interval over repeats.
RESAMPLES = 2000


def wilson(good: int, total: int) -> tuple[float, float]:
    """Wilson's 95% score interval of a proportion ``good / total`` (NaN for none)."""
    if total <= 0:
        return math.nan, math.nan
    p, z2 = good / total, Z975 * Z975
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = Z975 * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total)) / (1 + z2 / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the mean of ``values`` (NaN with fewer than
    two): inside their range, so never below zero for figures that cannot be."""
    if len(values) < 2:
        return math.nan, math.nan
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values)))
                   for _ in range(RESAMPLES))
    return means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]


def measured(outcomes: Sequence[tuple[float, bool]]) -> list[tuple[float, bool]]:
    """The (arrival s, met its SLO) pairs counted: the middle ``MEASURED_FRACTION`` by arrival."""
    ordered = sorted(outcomes, key=lambda o: o[0])
    cut = math.floor(len(ordered) * (1 - MEASURED_FRACTION) / 2 + 1e-9)
    return ordered[cut: len(ordered) - cut] or ordered


@dataclass(frozen=True)
class RunPoint:
    """One run at one rate: attainment (0-1), goodput (req/s), counted requests; and of the
    whole run, the requests sent, those the admission limit refused (``queue_full``,
    ``queue_timeout``: 0 without a limit) and those that failed otherwise (a live run's
    errors)."""

    rate: float
    attainment: float
    goodput: float
    counted: int
    requests: int = 0
    refused: int = 0
    errors: int = 0

    @property
    def good(self) -> int:
        """Counted requests that met their objectives."""
        return round(self.attainment * self.counted) if self.counted else 0


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

    def figure(self, name: str) -> list[tuple[float, float, float]]:
        """(mean, low, high) of ``attainment`` (Wilson over the counted requests) or
        ``goodput`` (bootstrap over repeats) at each rate; see the module."""
        found = []
        for points in self.runs:
            values = [getattr(p, name) for p in points if p.counted]
            mean = statistics.fmean(values) if values else math.nan
            if name == "attainment":
                low, high = wilson(sum(p.good for p in points), sum(p.counted for p in points))
            else:
                low, high = bootstrap(values)
            found.append((mean, low, high))
        return found

    def capacity(self, target: float) -> Capacity:
        """The capacity of the mean attainment curve."""
        return capacity(self.rates, [m for m, _, _ in self.figure("attainment")], target)

    def repeat_capacities(self, target: float) -> list[Capacity]:
        """Each repeat's own capacity (a bound where that repeat gives only one)."""
        repeats = min(len(points) for points in self.runs)
        return [capacity(self.rates, [points[i].attainment for points in self.runs], target)
                for i in range(repeats)]

    def capacity_interval(self, target: float) -> str:
        """The repeats' capacity: ``mean [low, high]`` (bootstrap) when every repeat found
        one; else the repeats' values and bounds, not averaged; "" with one repeat."""
        found = self.repeat_capacities(target)
        if len(found) < 2:
            return ""
        if any(c.bound for c in found):
            return "repeats " + ", ".join(sorted(map(str, found))) + " (bounds: not averaged)"
        rates = [c.rate for c in found]
        low, high = bootstrap(rates)
        return f"repeats {statistics.fmean(rates):.3g} [{low:.3g}, {high:.3g}]"

    def refused(self) -> list[tuple[int, int]]:
        """(refused by the admission limit, requests) at each rate, over its repeats."""
        return [(sum(p.refused for p in points), sum(p.requests for p in points))
                for points in self.runs]

    def errors(self) -> list[tuple[int, int]]:
        """(failed otherwise: neither finished nor refused, requests) at each rate."""
        return [(sum(p.errors for p in points), sum(p.requests for p in points))
                for points in self.runs]

    def monotonic(self) -> bool:
        """Whether mean attainment never rises with rate by more than its intervals allow
        (a rise beyond both Wilson intervals says the runs measured something else: the
        machine's speed moved, or the windows differ)."""
        figure = self.figure("attainment")
        return not any(b[1] > a[2] for a, b in zip(figure, figure[1:])
                       if not (math.isnan(a[2]) or math.isnan(b[1])))

    def to_dict(self, target: float) -> dict[str, Any]:
        return {"policy": self.policy, "rates": self.rates, "target": target,
                "capacity": str(self.capacity(target)),
                "capacity_repeats": [str(c) for c in self.repeat_capacities(target)],
                "capacity_interval": self.capacity_interval(target),
                "interval_method": INTERVALS, "monotonic": self.monotonic(),
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


def sweep_spec(spec: str, rate: float, repeat: int, redraw: bool = False) -> str:
    """The workload of one run: ``spec`` at ``rate``, repeat ``repeat`` (a file's next window,
    a synthetic workload's next seed); a file's own gaps scaled to the rate, or with
    ``redraw`` Poisson arrivals at the rate (its order and lengths kept); ValueError for a
    workload without a rate."""
    name, text = (spec, "") if Path(spec).exists() else split_spec(spec)
    options = dict(part.partition("=")[::2] for part in text.split(",") if part)
    if Path(name).exists():
        if repeat and "n" not in options and "duration" not in options:
            raise ValueError("--sweep-repeats: repeats of a file take its next windows: give "
                             "the window's n= or duration=")
        options.pop("speed", None)
        options["window"] = str(int(options.get("window", 0)) + repeat)
        if redraw:
            options.setdefault("burstiness", "1")
            options.setdefault("seed", str(repeat))
    elif name.startswith("article-"):
        raise ValueError(f"--sweep-rate: workload {name!r} has no arrival rate to sweep")
    else:
        options["seed"] = str(int(options.get("seed", 0)) + repeat)
    options["rate"] = f"{rate:g}"
    return f"{name}:" + ",".join(f"{k}={v}" for k, v in options.items())


def arrivals_note(spec: str, redraw: bool) -> str:
    """What "at a rate" means for ``spec``: a trace's own gaps scaled in time, or arrivals
    (re)drawn at the rate."""
    name = spec if Path(spec).exists() else split_spec(spec)[0]
    if not Path(name).exists():
        return "arrivals drawn at each rate"
    if redraw or "burstiness=" in spec:
        return "the trace's arrivals redrawn at each rate (its order and lengths kept)"
    return "the trace's own gaps scaled to each rate (--arrivals redraw: Poisson instead)"
