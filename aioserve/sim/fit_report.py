"""The step-cost fit presented: each term's share, R², the residuals by step shape, and a
profile's drift on steps it was not fitted on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aioserve.sim.step_cost import FEATURES, StepCostModel, feedback_features

if TYPE_CHECKING:
    from aioserve.scheduling import StepFeedback


def held_out_drift(model: StepCostModel, steps: Sequence[StepFeedback]) -> float:
    """Measured over predicted busy time of steps ``model`` was not fitted on: how much
    slower (> 1) or faster the machine ran than when it was calibrated (1.0 without steps)."""
    predicted = sum(model.cost_ms(*feedback_features(step)) for step in steps)
    measured = sum(step.duration_s for step in steps) * 1e3
    return measured / predicted if predicted > 0 else 1.0


def format_residuals(rows: Sequence[dict[str, Any]], worst: int) -> list[str]:
    """The ``worst`` rows of a residual table, one line each."""
    return [f"  {row['shape']:<28} {row['steps']:>5} {row['measured_ms']:>10.3f} "
            f"{row['predicted_ms']:>10.3f} {row['error_pct']:>+7.1f}% "
            f"{row.get('worst_step_error_pct', 0.0):>+7.1f}%" for row in rows[:worst]]


def format_fit(model: StepCostModel, worst: int = 6) -> str:
    """The calibration's printout: the formula, each term with its share, the fit, and the
    ``worst`` step shapes by relative error."""
    fit = model.fit
    lines = ["step cost (ms), per term: coefficient (share of the fitted time)"]
    units = {"intercept": "per step", "per_seq": "per row", "per_prefill_token":
             "per prefill token", "per_context_token": "per context token read",
             "per_prefill_pair": "per prefill attention pair"}
    for name, value in zip(FEATURES, model.coefficients()):
        share = fit.get(f"share_pct_{name}")
        lines.append(f"  {units[name]:<28} {value:.6g} ms"
                     + (f" ({share:.1f}%)" if share is not None else ""))
    if fit:
        lines.append(f"fit on {fit['steps']:.0f} steps: R^2 {fit['r2']:.3f}, mean |error| "
                     f"{fit['mean_abs_error_ms']:.3f} ms, median |error| "
                     f"{fit.get('median_abs_error_pct', float('nan')):.1f}% a step, total "
                     f"{fit['total_error_pct']:+.2f}%")
    if "cv_rmse_ms_pairs" in fit:
        kept = model.per_prefill_pair_ms > 0 or fit["cv_rmse_ms_pairs"] < fit["cv_rmse_ms_linear"]
        lines.append(f"prefill pair term {'kept' if kept else 'left out'}: cross-validated "
                     f"RMS error {fit['cv_rmse_ms_pairs']:.3f} ms with it, "
                     f"{fit['cv_rmse_ms_linear']:.3f} ms without")
    if model.residuals:
        lines.append(f"residuals by step shape (worst {min(worst, len(model.residuals))} of "
                     f"{len(model.residuals)}): shape, steps, measured ms, predicted ms (means), "
                     "error, worst step's error")
        lines += format_residuals(model.residuals, worst)
    return "\n".join(lines)
