"""How well a step-cost fit explains its own steps: R², each term's share, and the
residuals by step shape (kind, rows and prefill tokens, in power-of-two buckets)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from aioserve.scheduling import StepFeedback
    from aioserve.sim.step_cost import Features, StepCostModel


def fit_summary(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> dict[str, float]:
    """``steps``, ``r2``, ``mean_abs_error_ms``, ``total_error_pct``, ``median_abs_error_pct``
    (per step, relative to its time) and ``share_pct_<feature>`` of features ``x`` (one row a
    step, :data:`~aioserve.sim.step_cost.FEATURES` order), times ``y`` (ms) and ``coef``."""
    from aioserve.sim.step_cost import FEATURES

    predicted = x @ coef
    residual = y - predicted
    total = float(((y - y.mean()) ** 2).sum())
    fitted = float(predicted.sum()) or 1.0
    summary = {
        "steps": float(len(y)),
        "r2": 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0,
        "mean_abs_error_ms": float(np.abs(residual).mean()),
        "total_error_pct": 100.0 * float(predicted.sum() - y.sum()) / float(y.sum()),
        "median_abs_error_pct": 100.0 * float(np.median(np.abs(residual) / np.maximum(y, 1e-9))),
    }
    for i, name in enumerate(FEATURES):
        summary[f"share_pct_{name}"] = 100.0 * float((x[:, i] * coef[i]).sum()) / fitted
    return summary


def _bucket(value: int) -> int:
    """The power of two at or above ``value`` (1 for 0 or 1)."""
    return 1 << max(value - 1, 0).bit_length()


def shape_of(features: Features) -> str:
    """A step's shape: ``decode, rows<=R`` or ``prefill<=P tok, rows<=R``."""
    rows, prefill, _context, _pairs = features
    if prefill == 0:
        return f"decode, rows<={_bucket(rows)}"
    return f"prefill<={_bucket(prefill)} tok, rows<={_bucket(rows)}"


def residuals_by_shape(shapes: Sequence[Features], measured: np.ndarray,
                       predicted: np.ndarray) -> list[dict[str, Any]]:
    """Per step shape: ``shape``, ``steps``, ``measured_ms`` and ``predicted_ms`` (means),
    ``error_pct`` (predicted mean against measured mean) and ``worst_step_error_pct`` (the
    step's relative error of largest magnitude), the largest ``|error_pct|`` first."""
    groups: dict[str, list[int]] = {}
    for i, features in enumerate(shapes):
        groups.setdefault(shape_of(features), []).append(i)
    rows = []
    for shape, index in groups.items():
        real, fitted = float(measured[index].mean()), float(predicted[index].mean())
        errors = [100.0 * (predicted[i] - measured[i]) / measured[i] for i in index
                  if measured[i] > 0]
        rows.append({"shape": shape, "steps": len(index), "measured_ms": real,
                     "predicted_ms": fitted,
                     "error_pct": 100.0 * (fitted - real) / real if real > 0 else 0.0,
                     "worst_step_error_pct": float(max(errors, key=abs, default=0.0))})
    return sorted(rows, key=lambda row: -abs(row["error_pct"]))


def held_out_residuals(model: StepCostModel, steps: Sequence[StepFeedback]
                       ) -> list[dict[str, Any]]:
    """:func:`residuals_by_shape` of ``model`` on steps it was not fitted on (a real run)."""
    from aioserve.sim.step_cost import feedback_features

    shapes = [feedback_features(step) for step in steps]
    return residuals_by_shape(shapes, np.array([s.duration_s * 1e3 for s in steps]),
                              np.array([model.cost_ms(*shape) for shape in shapes]))


def format_residuals(rows: Sequence[dict[str, Any]], worst: int) -> list[str]:
    """The ``worst`` rows of a residual table, one line each."""
    return [f"  {row['shape']:<28} {row['steps']:>5} {row['measured_ms']:>10.3f} "
            f"{row['predicted_ms']:>10.3f} {row['error_pct']:>+7.1f}% "
            f"{row.get('worst_step_error_pct', 0.0):>+7.1f}%" for row in rows[:worst]]


def format_fit(model: StepCostModel, worst: int = 6) -> str:
    """The calibration's printout: the formula, each term with its share, the fit, and the
    ``worst`` step shapes by relative error."""
    from aioserve.sim.step_cost import FEATURES

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
