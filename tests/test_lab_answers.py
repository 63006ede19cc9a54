"""Issue 49's lab defects: rejected requests counted with their reason and a warning (7), and
a live capacity that states the machine's measured speed against the profile's (9)."""

from __future__ import annotations

import pytest

from aioserve.cli import main
from aioserve.commands.capacity import speed_line
from aioserve.reports.figures import reason_kind
from aioserve.sim.step_cost import StepCostModel


def test_rejections_are_counted_by_reason_with_a_warning(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "poisson:n=20", "--kv-blocks", "1"]) == 0
    captured = capsys.readouterr()
    assert "rejected 20 (20: needs N KV blocks for N prompt + N output tokens)" in captured.out
    warning = next(line for line in captured.err.splitlines() if line.startswith("warning"))
    assert warning.startswith("warning: fcfs: 20 of 20 requests not served (20 needs N KV")
    assert "first: p0000: needs" in warning  # the first reason in full
    assert main(["simulate", "--workload", "poisson:n=20", "--compare"]) == 0
    assert "warning" not in capsys.readouterr().err  # none when every request is served


def test_reasons_are_counted_by_kind() -> None:
    assert reason_kind("max_tokens: prompt (5 tokens) + max_tokens (9)") == "max_tokens"
    assert reason_kind("queue full, 12 waiting") == "queue full"


def test_the_live_capacity_states_the_machine_speed_against_the_profile() -> None:
    profile = StepCostModel(10.0)
    line = speed_line([0.020, 0.020, 0.030], 5.0, profile)
    assert "median TPOT at 5 req/s 20.00 ms" in line
    assert "decode step of one request 10.00 ms" in line and "0.50x the profile" in line
    assert "give --profile" in speed_line([0.01, 0.01], 1.0, None)
    assert "no request" in speed_line([], 1.0, profile)
