"""The step-cost fit (issue 32 item 4): it recovers known coefficients from synthetic step
timings, keeps the prefill pair term only where the timings grow faster than linearly,
reports its residuals by step shape, and profiles written before the pair term still load."""

from __future__ import annotations

import json
import random

import pytest

from aioserve.runners.base import ScheduledBatch
from aioserve.scheduling import StepFeedback
from aioserve.sim.fit_report import format_fit, held_out_drift
from aioserve.sim.step_cost import (
    StepCostModel,
    batch_features,
    feedback_features,
    fit_profile,
    fit_steps,
    shape_of,
)

TRUE = StepCostModel(3.0, per_seq_ms=0.4, per_prefill_token_ms=0.05,
                     per_context_token_ms=0.002, per_prefill_pair_ms=2e-5)


def step(index: int, rows: list[tuple[int, int, bool]], ms: float) -> StepFeedback:
    """A finished step of ``(tokens fed, start position, is decode)`` rows taking ``ms``."""
    return StepFeedback(
        step=index, start_time=index, end_time=index + ms / 1e3,
        request_ids=tuple(f"r{i}" for i in range(len(rows))),
        num_computed_tokens=tuple(n for n, _, _ in rows),
        start_positions=tuple(s for _, s, _ in rows),
        num_emitted_tokens=tuple(1 for _ in rows),
        is_decode=tuple(d for _, _, d in rows), finished=())


def synthetic_steps(model: StepCostModel, noise: float = 0.0, n: int = 240, seed: int = 0
                    ) -> list[StepFeedback]:
    """Steps of varied shapes (decode batches, prompts up to 1,024 tokens, mixes) timed by
    ``model``, each off by up to ``noise`` (relative, uniform)."""
    rng = random.Random(seed)
    steps = []
    for i in range(n):
        rows = [(1, rng.randint(8, 900), True) for _ in range(rng.randint(0, 8))]
        if i % 3 == 0 or not rows:
            rows.append((rng.choice([16, 64, 256, 512, 1024]), rng.choice([0, 0, 128]), False))
        ms = model.cost_ms(*feedback_features(step(i, rows, 0)))
        steps.append(step(i, rows, ms * (1 + rng.uniform(-noise, noise))))
    return steps


def test_pairs_count_the_padded_prefill_rectangle():
    """Prefill rows are padded to one rectangle: a 4-token chunk from position 10 and a
    2-token one from 0 compute 2 rows x 4 queries x 14 keys = 112 pairs (their causal
    pairs are 50 + 3); a decode row adds its context but no pairs; the batch and the
    feedback agree."""
    feedback = step(0, [(4, 10, False), (1, 30, True), (2, 0, False)], 1.0)
    assert feedback_features(feedback) == (3, 6, 14 + 31 + 2, 112)
    batch = ScheduledBatch(request_ids=["a", "b", "c"], num_scheduled_tokens=[4, 1, 2],
                           start_positions=[10, 30, 0], sample=[True, True, True],
                           num_output_tokens=[0, 5, 0])
    assert batch_features(batch) == feedback_features(feedback)
    assert TRUE.batch_cost_ms(batch) == pytest.approx(
        3.0 + 3 * 0.4 + 6 * 0.05 + 47 * 0.002 + 112 * 2e-5)
    assert feedback_features(step(1, [(1, 30, True)], 1.0))[3] == 0


def test_the_fit_recovers_known_coefficients_with_the_pair_term():
    model = fit_steps(synthetic_steps(TRUE))
    assert model.coefficients() == pytest.approx(TRUE.coefficients(), rel=1e-6)
    assert model.fit["r2"] == pytest.approx(1.0)
    assert model.fit["total_error_pct"] == pytest.approx(0.0, abs=1e-6)
    shares = sum(model.fit[f"share_pct_{name}"] for name in
                 ("intercept", "per_seq", "per_prefill_token", "per_context_token",
                  "per_prefill_pair"))
    assert shares == pytest.approx(100.0)


def test_calibration_keeps_the_pair_term_only_where_prefill_grows_faster_than_linearly():
    quadratic = fit_profile(synthetic_steps(TRUE, noise=0.05))
    assert quadratic.fit["cv_rmse_ms_pairs"] < quadratic.fit["cv_rmse_ms_linear"]
    assert quadratic.per_prefill_pair_ms == pytest.approx(2e-5, rel=0.1)
    assert quadratic.per_prefill_token_ms == pytest.approx(0.05, rel=0.1)
    linear_truth = StepCostModel(3.0, 0.4, 0.05, 0.002)
    linear = fit_profile(synthetic_steps(linear_truth, noise=0.05))
    assert linear.fit["cv_rmse_ms_pairs"] >= linear.fit["cv_rmse_ms_linear"]
    assert linear.per_prefill_pair_ms == 0.0
    assert linear.per_prefill_token_ms == pytest.approx(0.05, rel=0.1)
    assert "prefill pair term left out" in format_fit(linear)
    assert "prefill pair term kept" in format_fit(quadratic)


def test_residuals_group_steps_by_shape_worst_first():
    """A linear fit of quadratic timings misses by shape: reported per shape, worst first."""
    steps = synthetic_steps(TRUE)
    model = fit_steps(steps, features=("intercept", "per_seq", "per_prefill_token",
                                       "per_context_token"))
    rows = model.residuals
    assert [set(row) for row in rows] == [
        {"shape", "steps", "measured_ms", "predicted_ms", "error_pct",
         "worst_step_error_pct"}] * len(rows)
    assert sum(row["steps"] for row in rows) == len(steps)
    assert len({row["shape"] for row in rows}) == len(rows)
    errors = [abs(row["error_pct"]) for row in rows]
    assert errors == sorted(errors, reverse=True) and errors[0] > 1.0
    for row in rows:
        assert abs(row["worst_step_error_pct"]) >= abs(row["error_pct"]) - 1e-9
        assert row["error_pct"] == pytest.approx(
            100 * (row["predicted_ms"] - row["measured_ms"]) / row["measured_ms"])
    assert shape_of((8, 0, 900, 0)) == "decode, rows<=8"
    assert shape_of((3, 600, 700, 1000)) == "prefill<=1024 tok, rows<=4"
    printed = format_fit(model)
    assert rows[0]["shape"] in printed and "R^2" in printed


def test_drift_is_how_much_slower_the_steps_ran_than_the_profile_says():
    """Steps timed by the profile 1.3 times over: drift 1.3, and the profile scaled by it
    prices every one of them exactly."""
    steps = synthetic_steps(TRUE.scaled(1.3))
    assert held_out_drift(TRUE, steps) == pytest.approx(1.3)
    assert held_out_drift(TRUE.scaled(1.3), steps) == pytest.approx(1.0)
    assert held_out_drift(TRUE, []) == 1.0
    assert TRUE.scaled(2.0).cost_ms(3, 100, 500, 70) == pytest.approx(
        2 * TRUE.cost_ms(3, 100, 500, 70))



def test_a_profile_without_the_new_fields_loads_with_the_pair_term_at_zero(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({
        "intercept_ms": 3.06, "per_seq_ms": 0.0, "per_prefill_token_ms": 0.063,
        "per_context_token_ms": 0.0001, "source": {"slots": 8}, "fit": {"r2": 0.5}}))
    model = StepCostModel.load(path)
    assert model.per_prefill_pair_ms == 0.0 and model.residuals == []
    assert model.cost_ms(2, 100, 300, pairs=5000) == pytest.approx(3.06 + 6.3 + 0.03)
    new = fit_steps(synthetic_steps(TRUE), source={"slots": 8})
    assert StepCostModel.load(new.save(tmp_path / "new.json")) == new


def test_a_profile_with_bad_residuals_is_refused_naming_them(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"intercept_ms": 1.0, "residuals": {"x": 1}}))
    with pytest.raises(ValueError, match="residuals must be a JSON list"):
        StepCostModel.load(path)
    path.write_text(json.dumps({"intercept_ms": 1.0, "per_prefill_pair_ms": -1}))
    with pytest.raises(ValueError, match="per_prefill_pair_ms must be a finite number >= 0"):
        StepCostModel.load(path)
