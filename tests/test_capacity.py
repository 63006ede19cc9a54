"""The capacity search (issue 32, item 2): the counting rule, the 95% CI, the interpolated
capacity, and a sweep that finds a crossing known in advance."""

from __future__ import annotations

import json
import statistics

import pytest

from aioserve.cli import main
from aioserve.sim.capacity import (
    Curve,
    RunPoint,
    capacity,
    mean_ci,
    measured,
    parse_rates,
    run_point,
    sweep_spec,
    t975,
)
from aioserve.reports.sweep import format_sweep, simulate_sweep, write_sweep_html
from aioserve.sim.simulator import SimConfig


def test_confidence_interval_is_student_t():
    values = [0.8, 0.9, 1.0]
    mean, half = mean_ci(values)
    assert mean == pytest.approx(0.9)
    assert half == pytest.approx(4.303 * statistics.stdev(values) / 3 ** 0.5)
    assert t975(1) == 12.706 and t975(200) == 1.96
    assert mean_ci([0.5])[0] == 0.5 and mean_ci([0.5])[1] != mean_ci([0.5])[1]  # NaN


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
        attained = [m for m, _ in curve.figure("attainment")]
        assert attained[:3] == [1.0, 1.0, 1.0] and attained[4] < 0.1
        assert 2.0 < curve.capacity(0.9).rate < 2.5
        assert curve.figure("attainment")[0][1] == 0  # three equal windows: no spread
    text = format_sweep(curves, 0.9)
    assert "capacity @ 90%" in text and "fcfs" in text
    back = Curve.from_dict(json.loads(json.dumps(curves[0].to_dict(0.9))))
    assert back.capacity(0.9) == curves[0].capacity(0.9)
    page = write_sweep_html(curves, 0.9, tmp_path / "s.html", "sweep").read_text()
    assert "data:image/png;base64," in page and "spf" in page


def test_repeat_capacities_give_the_capacity_interval():
    curve = Curve("x", [1.0, 2.0], [[RunPoint(1, 1.0, 1, 10), RunPoint(1, 1.0, 1, 10)],
                                    [RunPoint(2, 0.8, 1, 10), RunPoint(2, 0.4, 1, 10)]])
    mean, half = curve.capacity_ci(0.9)
    assert mean == pytest.approx((1.5 + 1 + 1 / 6) / 2)  # 1.5 and 1.1667
    assert half > 0


def test_simulate_sweep_rate_on_the_command_line(capsys, tmp_path):
    status = main(["simulate", "--workload", "poisson:n=30", "--scheduler", "fcfs,spf",
                   "--sweep-rate", "0.5:2:2", "--sweep-repeats", "2", "--slo-ttft-ms", "5000",
                   "--json", "--report", str(tmp_path / "c.html")])
    out = capsys.readouterr().out.splitlines()
    assert status == 0 and "capacity @ 90% (req/s)" in "\n".join(out)
    rows = [json.loads(line) for line in out if line.startswith("{")]
    assert [r["policy"] for r in rows] == ["fcfs", "spf"] and rows[0]["rates"] == [0.5, 2.0]
    assert all(len(points) == 2 for points in rows[0]["runs"])
    assert (tmp_path / "c.html").exists()


@pytest.mark.parametrize(("args", "error"), [
    (["simulate", "--sweep-rate", "3:1"], "--sweep-rate: expected LO:HI[:N] with 0 < LO <= HI"),
    (["simulate", "--sweep-rate", "1:2", "--workload", "article-mix"], "no arrival rate"),
    (["simulate", "--sweep-rate", "1:2", "--workload", "poisson", "--target-attainment", "2"],
     "--target-attainment: must be in (0, 1]"),
    (["bench", "serve", "--sweep-rate", "1:2"], "--sweep-rate: give the --workload"),
])
def test_sweep_and_arrival_flags_are_refused_by_name(capsys, args, error):
    assert main(args) == 2
    assert error in capsys.readouterr().err
