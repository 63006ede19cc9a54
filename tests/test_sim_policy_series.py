"""Issue 50: ``simulate --report`` plots each policy's ``report()`` over virtual time (the
series sampled after every step, a table of them and their figure on the page)."""

from __future__ import annotations

import re

from aioserve.cli import main
from aioserve.reports.policy_series import PolicySeries
from aioserve.scheduling import OrderedScheduler, PolicyReport
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.scenarios import load_workload
from schedulers.vtc import VTCScheduler


async def test_series_follow_the_vtc_counters_step_by_step():
    policy = VTCScheduler()
    series = PolicySeries()
    result = await simulate(load_workload("two-tenants:n=40,rate=60"), policy,
                            SimConfig(slots=4), on_step=series.on_step)
    assert len(series.series["service_gap"]) == len(result.steps)  # one sample a step
    for tenant in ("heavy", "light"):
        points = series.series[f"counters.{tenant}"]  # from the tenant's first arrival
        assert len(points) > 100
        times = [t for t, _ in points]
        values = [v for _, v in points]
        assert times == sorted(times) and values == sorted(values)  # service only grows
        # the hook runs before the policy hears of the step: one token a slot behind at most
        assert 0 <= policy.counters[tenant] - values[-1] <= 2 * 4


class Raising(OrderedScheduler):
    name = "raising"

    def report(self) -> PolicyReport:
        raise RuntimeError("broken report")


async def test_a_report_that_raises_stops_its_series_not_the_run():
    series = PolicySeries()
    result = await simulate(load_workload("two-tenants:n=20,rate=60"), Raising(),
                            SimConfig(slots=4), on_step=series.on_step)
    assert len(result.finished) == 20 and series.failed and series.series == {}


def test_simulate_report_has_each_policys_series_and_their_figure(tmp_path, capsys):
    path = tmp_path / "report.html"
    argv = ["simulate", "--scheduler", "fcfs,vtc,mlfq", "--workload",
            "two-tenants:n=60,rate=60", "--compare", "--report", str(path)]
    assert main(argv) == 0
    assert f"report: {path}" in capsys.readouterr().err
    page = path.read_text()
    rows = set(re.findall(r"<tr><td>(\w+)</td><td>([\w.]+)</td><td>(\d+)</td>", page))
    named = {(policy, name) for policy, name, _ in rows}
    assert {("vtc", "counters.heavy"), ("vtc", "counters.light"), ("vtc", "service_gap"),
            ("mlfq", "level_occupancy.0"), ("mlfq", "evictions")} <= named
    assert all(int(samples) > 10 for _, _, samples in rows)
    assert not any(policy == "fcfs" for policy, _ in named)  # fcfs reports nothing
    assert '<h2>policy report() over time</h2>\n<img alt="policy report() over time"' in page
