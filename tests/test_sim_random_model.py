"""``aioserve calibrate --random-model`` (issue 32 item 4): a random-weight model of
a shape is calibrated like a real one, the profile stores its fit and residuals, and a trace
window replays with it, simulated and (``--real``) on the random model itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_random_model import TINY

from aioserve.cli import main
from aioserve.sim.step_cost import FEATURES, StepCostModel

AZURE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023-conv.csv"


def test_calibrate_a_random_model_then_replay_a_trace_window(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = tmp_path / "tiny-llama.json"
    config.write_text(json.dumps(TINY))
    profile = tmp_path / "tiny.json"
    assert main(["calibrate", "--random-model", str(config), "--slots", "2",
                 "--kv-blocks", "64", "--max-model-len", "256", "--repeats", "1",
                 "--profile-out", str(profile)]) == 0
    printed = capsys.readouterr().out
    model = StepCostModel.load(profile)
    assert model.source["random_model"] == str(config)
    assert model.source["device"] == "cpu" and model.source["max_model_len"] == 256
    assert {"r2", "cv_rmse_ms_linear", "cv_rmse_ms_pairs"} <= set(model.fit)
    assert {f"share_pct_{name}" for name in FEATURES} <= set(model.fit)
    assert sum(row["steps"] for row in model.residuals) == model.fit["steps"]
    assert "prefill pair term" in printed and model.residuals[0]["shape"] in printed
    if not AZURE.exists():
        pytest.skip(f"no trace at {AZURE}")
    assert main(["simulate", "--profile", str(profile), "--json",
                 "--workload", f"{AZURE}:n=8,max_len=256"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["finished"] == 8
    assert main(["simulate", "--real", "--random-model", str(config), "--slots", "2",
                 "--kv-blocks", "64", "--max-model-len", "256", "--json",
                 "--workload", f"{AZURE}:n=4,max_len=256,rate=100"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["finished"] == 4
