"""The capacity search (issue 32, item 2): the counting rule, the 95% CI, the interpolated
capacity, and a sweep that finds a crossing known in advance."""

from __future__ import annotations

import json
import math

import pytest

from aioserve.cli import main
from aioserve.reports.sweep import format_sweep, simulate_sweep, write_sweep_html
from aioserve.sim.capacity import (
    Curve,
    RunPoint,
    arrivals_note,
    bootstrap,
    capacity,
    measured,
    parse_rates,
    run_point,
    sweep_spec,
    wilson,
)
from aioserve.sim.simulator import SimConfig


def test_intervals_stay_inside_what_the_figure_can_be():
    """Issue 48 item 7: Wilson's interval for attainment never leaves 0-100% (a t interval
    on 1.0, 1.0, 0.4 went above 100%); a bootstrap over repeats never goes below zero."""
    assert wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 10)[0] == pytest.approx(0.0)
    assert wilson(0, 10)[0] >= 0.0 and wilson(10, 10)[1] <= 1.0
    low, high = wilson(9, 10)
    assert 0.59 < low < 0.6 and 0.98 < high < 0.99  # the textbook 0.596-0.982
    low, high = bootstrap([0.0, 0.1, 3.0])
    assert 0.0 <= low <= high <= 3.0
    assert all(math.isnan(v) for v in bootstrap([0.5]))  # none with one value


def test_counting_rule_drops_the_first_and_last_tenth_of_arrivals():
    outcomes = [(float(t), t >= 2) for t in range(20)]
    counted = measured(outcomes)
    assert [t for t, _ in counted] == [float(t) for t in range(2, 18)]
    point = run_point(1.0, outcomes)
    assert point.attainment == 1.0 and point.counted == 16
    assert point.goodput == pytest.approx(1.0)  # 15 gaps over 15 s, all good


def test_capacity_interpolates_between_the_rates_around_the_crossing():
    assert capacity([1, 2, 3], [1.0, 0.95, 0.85], 0.9).rate == pytest.approx(2.5)
    assert str(capacity([1, 2], [0.5, 0.2], 0.9)) == "<1"
    assert str(capacity([1, 2], [1.0, 0.95], 0.9)) == ">=2"


def test_rates_and_specs_of_a_sweep(tmp_path):
    assert parse_rates("1:3:3") == [1, 2, 3] and parse_rates("2:2:1") == [2]
    assert parse_rates("2:2") == [2] and len(parse_rates("1:3")) == 5
    for bad in ("3:1", "1", "0:2", "1:2:0", "1:3:1", "2:2:3"):
        with pytest.raises(ValueError, match="--sweep-rate"):
            parse_rates(bad)
    assert sweep_spec("poisson:n=50,seed=4", 2, 1) == "poisson:n=50,seed=5,rate=2"
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,2\n")
    assert sweep_spec(f"{path}:n=20,speed=2", 1.5, 2) == f"{path}:n=20,window=2,rate=1.5"
    with pytest.raises(ValueError, match="give the window's n= or duration="):
        sweep_spec(str(path), 1, 1)
    with pytest.raises(ValueError, match="no arrival rate"):
        sweep_spec("article-mix", 1, 0)


async def test_sweep_finds_the_known_crossing(tmp_path):
    """One slot, 10 output tokens of 50 ms: service 0.5 s, so the engine takes 2 req/s.
    Below, no request waits (TTFT one step); above, the queue grows and a 1 s TTFT objective
    fails for all but the first few: the capacity lies between 2 and 2.5 req/s."""
    path = tmp_path / "even.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"r{i}", "arrival_s": i, "prompt_len": 8,
                                          "output_len": 10}) for i in range(150)))
    rates = parse_rates("1:3:5")
    curves = await simulate_sweep(f"{path}:n=50", ["fcfs", "spf"], rates, 3,
                                  lambda _w: SimConfig(slots=1), 1000.0, None)
    for curve in curves:
        attained = [m for m, _, _ in curve.figure("attainment")]
        assert attained[:3] == [1.0, 1.0, 1.0] and attained[4] < 0.1
        assert 2.0 < curve.capacity(0.9).rate < 2.5
        assert curve.figure("goodput")[0][1] == curve.figure("goodput")[0][2]  # no spread
    text = format_sweep(curves, 0.9)
    assert "capacity @ 90%" in text and "fcfs" in text
    back = Curve.from_dict(json.loads(json.dumps(curves[0].to_dict(0.9))))
    assert back.capacity(0.9) == curves[0].capacity(0.9)
    page = write_sweep_html(curves, 0.9, tmp_path / "s.html", "sweep").read_text()
    assert "data:image/png;base64," in page and "spf" in page


def test_repeat_capacities_give_the_capacity_interval():
    curve = Curve("x", [1.0, 2.0], [[RunPoint(1, 1.0, 1, 10), RunPoint(1, 1.0, 1, 10)],
                                    [RunPoint(2, 0.8, 1, 10), RunPoint(2, 0.4, 1, 10)]])
    assert [c.rate for c in curve.repeat_capacities(0.9)] == pytest.approx([1.5, 1 + 1 / 6])
    assert curve.capacity_interval(0.9).startswith("repeats 1.33 [1.17, 1.5]")


def test_a_repeat_that_only_bounds_the_capacity_is_not_averaged():
    """One repeat met the target at every rate (>= 2), one crossed at 1.5: the answer
    says so; it is not (1.5 + 2) / 2."""
    curve = Curve("x", [1.0, 2.0], [[RunPoint(1, 1.0, 1, 10), RunPoint(1, 1.0, 1, 10)],
                                    [RunPoint(2, 0.8, 1, 10), RunPoint(2, 1.0, 1, 10)]])
    assert curve.capacity_interval(0.9) == "repeats 1.5, >=2 (bounds: not averaged)"
    low = Curve("y", [1.0, 2.0], [[RunPoint(1, 0.5, 1, 10)], [RunPoint(2, 0.2, 1, 10)]])
    text = format_sweep([curve, low], 0.9)
    assert "y: capacity <1 (a bound: below the lowest rate swept, 1 req/s)" in text
    assert "Wilson" in text and "bootstrap" in text
    assert max(len(line) for line in text.splitlines()[:4]) <= 100
    assert text.splitlines()[1].split()[:2] == ["policy", "capacity"]  # the answer first


def test_a_curve_rising_beyond_its_intervals_is_flagged():
    """Issue 49 defect 9: live 99% at 30, 18% at 35, 92% at 40 req/s is no curve."""
    points = [[RunPoint(r, a, a * r, 100)] for r, a in ((30, 0.99), (35, 0.18), (40, 0.92))]
    curve = Curve("server", [30.0, 35.0, 40.0], points)
    assert not curve.monotonic()
    assert "not monotonic" in format_sweep([curve], 0.9)
    assert Curve("ok", [1.0, 2.0], [[RunPoint(1, 1.0, 1, 50)], [RunPoint(2, 0.5, 1, 50)]]
                 ).monotonic()


def test_a_trace_at_a_rate_says_whether_it_scales_or_redraws(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,2\n1,4,2\n")
    assert "own gaps scaled" in arrivals_note(f"{path}:n=2", False)
    assert "redrawn" in arrivals_note(f"{path}:n=2", True)
    assert sweep_spec(f"{path}:n=2", 3, 1, redraw=True) == (
        f"{path}:n=2,window=1,burstiness=1,seed=1,rate=3")
    assert arrivals_note("poisson:n=5", False) == "arrivals drawn at each rate"


def test_capacity_sweep_rate_on_the_command_line(capsys, tmp_path):
    status = main(["capacity", "--workload", "poisson:n=30", "--scheduler", "fcfs,spf",
                   "--sweep-rate", "0.5:2:2", "--sweep-repeats", "2", "--slo-ttft-ms", "5000",
                   "--json", "--report", str(tmp_path / "c.html")])
    out = capsys.readouterr().out.splitlines()
    assert status == 0 and "capacity @ 90% (req/s)" in "\n".join(out)
    rows = [json.loads(line) for line in out if line.startswith("{")]
    assert [r["policy"] for r in rows] == ["fcfs", "spf"] and rows[0]["rates"] == [0.5, 2.0]
    assert all(len(points) == 2 for points in rows[0]["runs"])
    assert (tmp_path / "c.html").exists()


@pytest.mark.parametrize(("args", "error"), [
    (["capacity", "--sweep-rate", "3:1"], "--sweep-rate: expected LO:HI[:N] with 0 < LO <= HI"),
    (["capacity", "--sweep-rate", "20:60:1"], "N is 1 exactly when LO = HI"),
    (["capacity", "--sweep-rate", "20:20:3"], "N is 1 exactly when LO = HI"),
    (["capacity", "--sweep-rate", "1:2", "--workload", "article-mix"], "no arrival rate"),
    (["capacity", "--sweep-rate", "1:2", "--workload", "poisson", "--target-attainment", "2"],
     "--target-attainment: must be in (0, 1]"),
    (["capacity", "--sweep-rate", "1:2", "--url", "http://127.0.0.1:9", "--workload",
      "poisson", "--scheduler", "spf"], "--scheduler: not with --url"),
    (["capacity", "--sweep-rate", "1:2", "--url", "http://127.0.0.1:9", "--workload",
      "poisson", "--max-waiting", "4"], "--max-waiting: not with --url"),
    (["simulate", "--workload", "poisson:n=1e12"], "n must be 1..1,000,000 requests"),
    (["simulate", "--workload", "poisson:n=2.5"], "n must be a whole number, got '2.5'"),
    (["bench", "serve", "--sweep-rate", "1:2"], "--sweep-rate: give the --workload"),
])
def test_sweep_and_arrival_flags_are_refused_by_name(capsys, args, error):
    assert main(args) == 2
    assert error in capsys.readouterr().err
