"""The comparison report says what it measured (issue 31, item 5): Jain's index weighted
by the policy's tenant weights and its window shown, "-" for SLO attainment where no
request carries an objective, and the simulator's timing model on its output."""

from __future__ import annotations

import json

import pytest

from aioserve.cli import main
from aioserve.reports.compare import comparison_tables, format_comparison
from aioserve.reports.figures import backlogged_window, jain, policy_figures
from aioserve.scheduling.registry import params_by_policy
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.scenarios import two_tenants


def test_jain_weighted():
    assert jain([3.0, 1.0]) == pytest.approx(0.8)            # a correct 3:1 split, unweighted
    assert jain([3.0, 1.0], [3.0, 1.0]) == pytest.approx(1.0)  # weighted: fair


async def test_the_policy_weights_and_the_window_reach_the_figures():
    workload = two_tenants(n=150, rate=30.0, light=0.4)
    result = await simulate(workload, "vtc", SimConfig(slots=4, step_ms=20),
                            scheduler_params={"weights": {"light": 3.0}})
    figures = policy_figures(result)
    service, window = backlogged_window(result)
    weights = [3.0 if t == "light" else 1.0 for t in service]
    assert figures["jain_index"] == pytest.approx(jain(list(service.values()), weights))
    assert figures["jain_weights"] == {"heavy": 1.0, "light": 3.0}
    assert 0 < window < len(result.feedback)
    assert figures["jain_window"] == f"{window}/{len(result.feedback)}"
    text = format_comparison([figures])
    assert f"{window}/{len(result.feedback)}" in text
    assert "vtc: Jain's index of service / weight (heavy=1, light=3)" in text


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["simulate", "--workload", "routes:n=30,rate=3", "--slots", "4", *args]) == 0
    return capsys.readouterr().out


def test_slo_attainment_is_a_dash_without_objectives(capsys):
    out = run_cli(capsys, "--scheduler", "fcfs", "--compare", "--json")
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["slo_attainment"] is None and figures["goodput_req_s"] > 0
    table = comparison_tables([figures])[0]
    assert table.rows[0][table.headers.index("SLO %")] == "-"
    given = run_cli(capsys, "--scheduler", "fcfs", "--compare", "--json",
                    "--slo-ttft-ms", "100000")
    assert json.loads(given.strip().splitlines()[-1])["slo_attainment"] == 1.0


def test_the_output_states_its_timing_model(capsys, tmp_path):
    flat = run_cli(capsys, "--scheduler", "fcfs", "--step-ms", "20")
    assert "timing: flat, 20 ms a step" in flat
    assert "prefill and recomputation free" in flat
    assert "context 2048 tokens" in flat
    charged = run_cli(capsys, "--scheduler", "fcfs", "--prefill-ms-per-token", "0.5",
                      "--max-model-len", "4096")
    assert "prefill and recomputation 0.5 ms per token" in charged
    assert "context 4096 tokens" in charged
    profile = StepCostModel(2.0, 0.1, 0.05, 0.001, source={"forward": "lean-llama"})
    path = profile.save(tmp_path / "profile.json")
    calibrated = run_cli(capsys, "--scheduler", "fcfs", "--profile", str(path), "--compare")
    assert "timing: calibrated profile (forward lean-llama), one step ahead" in calibrated


def test_a_near_miss_policy_key_names_the_policies_of_the_run():
    with pytest.raises(ValueError, match=r"'vtcc' names none of the policies of this run "
                       r"\(fcfs, vtc\); did you mean 'vtc'\?"):
        params_by_policy(["fcfs", "vtc"], {"vtcc": {"weights": {"a": 3}}})
    spec = "schedulers.vtc:VTCScheduler"
    assert params_by_policy(["fcfs", spec], {"vtc": {"preempt": False}}) == {
        "fcfs": None, spec: {"preempt": False}}  # a policy's name keys its spec
