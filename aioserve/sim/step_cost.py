"""StepCostModel: an engine step's cost as a linear function of its batch, fitted on real steps.

    cost = intercept + per_seq * rows + per_prefill_token * prefill tokens
           + per_context_token * context tokens read + per_prefill_pair * prefill pairs

The roofline split Vidur's and vLLM's performance models use: per step (launches, host
work), per row (sampling, attention set-up), per token fed (linear layers), per KV
position read (attention), and per (query, key) pair the prefill attention computes:
prefill that grows faster than linearly (Vidur's attention-prefill term). Vidur counts
each row's causal pairs (``n * start + n (n + 1) / 2``); this engine pads the step's
prefill rows (those feeding more than one token) to one rectangle and masks it
(``runners/attention/paged_metadata.py``), so it computes rows x longest chunk x longest
context, and that is what is counted: three prompts of 10, 40 and 400 tokens cost three
of 400, and a step of several prompts costs more than one of the same tokens. The engine
splits four or more prefill rows into two groups where that saves padding; the count
keeps one (an upper bound). A real step's cost is its period, start to end. Profiles
written before the pair term load with it at 0; those written before 6 Dec 2026 counted
causal pairs (recalibrate)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from aioserve.runners.base import ScheduledBatch
from aioserve.scheduling import StepFeedback

#: The features' names, in the order of the coefficients.
FEATURES = ("intercept", "per_seq", "per_prefill_token", "per_context_token", "per_prefill_pair")

#: (rows, prefill tokens, context tokens, prefill pairs) of a step.
Features = tuple[int, int, int, int]


def padded_pairs(rows: int, longest_chunk: int, longest_context: int) -> int:
    """(query, key) pairs of ``rows`` prefill rows padded to one rectangle (module docstring)."""
    return rows * longest_chunk * longest_context


def batch_features(batch: ScheduledBatch) -> Features:
    """(rows, prefill tokens, context tokens, prefill pairs) of a batch (the simulator's hot
    path: one loop)."""
    prefill = context = prefill_rows = chunk = width = 0
    for count, start, produced in zip(batch.num_scheduled_tokens, batch.start_positions,
                                      batch.num_output_tokens):
        if not (count == 1 and produced > 0):
            prefill += count
        if count > 1:
            prefill_rows += 1
            chunk = max(chunk, count)
            width = max(width, start + count)
        context += start + count
    return len(batch.request_ids), prefill, context, padded_pairs(prefill_rows, chunk, width)


def feedback_features(step: StepFeedback) -> Features:
    """(rows, prefill tokens, context tokens, prefill pairs) of a finished step."""
    rows = [(count, start + count) for count, start in
            zip(step.num_computed_tokens, step.start_positions) if count > 1]
    pairs = padded_pairs(len(rows), max(count for count, _ in rows),
                         max(width for _, width in rows)) if rows else 0
    return step.num_seqs, step.num_prefill_tokens, step.num_context_tokens, pairs


@dataclass(frozen=True)
class StepCostModel:
    """Milliseconds per step as a linear function of the batch (coefficients >= 0, in ms).

    ``source`` says what it was fitted on; ``fit`` its quality on its own records
    (``steps``, ``r2``, ``mean_abs_error_ms``, ``total_error_pct``, ``share_pct_<feature>``:
    each term's share of the fitted time); ``residuals`` the fit by step shape
    (:func:`residuals_by_shape`, worst first)."""

    intercept_ms: float
    per_seq_ms: float = 0.0
    per_prefill_token_ms: float = 0.0
    per_context_token_ms: float = 0.0
    per_prefill_pair_ms: float = 0.0
    source: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, float] = field(default_factory=dict)
    residuals: list[dict[str, Any]] = field(default_factory=list)

    def coefficients(self) -> tuple[float, ...]:
        """The coefficients in :data:`FEATURES` order."""
        return tuple(float(getattr(self, f"{feature}_ms")) for feature in FEATURES)

    def cost_ms(self, rows: int, prefill: int, context: int, pairs: int = 0) -> float:
        return (self.intercept_ms + self.per_seq_ms * rows
                + self.per_prefill_token_ms * prefill + self.per_context_token_ms * context
                + self.per_prefill_pair_ms * pairs)

    def batch_cost_ms(self, batch: ScheduledBatch) -> float:
        return self.cost_ms(*batch_features(batch))

    def scaled(self, factor: float) -> StepCostModel:
        """The same step shapes on a machine ``factor`` times slower (every coefficient times
        ``factor``)."""
        scaled: dict[str, Any] = {f"{feature}_ms": factor * value for feature, value
                                  in zip(FEATURES, self.coefficients())}
        return replace(self, **scaled)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> StepCostModel:
        """Read a profile written by :meth:`save`; a ValueError names what is wrong."""
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError("not a JSON object of coefficients (write one with --calibrate)")
        known = [f.name for f in fields(cls)]
        unknown = [key for key in data if key not in known]
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} (known: {', '.join(known)})")
        if "intercept_ms" not in data:
            raise ValueError("intercept_ms is required")
        coefficients = [f"{feature}_ms" for feature in FEATURES]
        for name in coefficients:
            value = data.get(name, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 <= value < math.inf):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("source", "fit"):
            if not isinstance(data.get(name, {}), dict):
                raise ValueError(f"{name} must be a JSON object, got {data[name]!r}")
        if not isinstance(data.get("residuals", []), list):
            raise ValueError(f"residuals must be a JSON list, got {data['residuals']!r}")
        return cls(**data)


def fit_summary(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> dict[str, float]:
    """``steps``, ``r2``, ``mean_abs_error_ms``, ``total_error_pct``, ``median_abs_error_pct``
    (per step, relative to its time) and ``share_pct_<feature>`` of features ``x`` (one row a
    step, :data:`~aioserve.sim.step_cost.FEATURES` order), times ``y`` (ms) and ``coef``."""
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


def fit_steps(steps: Sequence[StepFeedback], source: dict[str, Any] | None = None,
              features: Sequence[str] = FEATURES) -> StepCostModel:
    """Least-squares fit on real steps of the ``features`` named (the others stay 0), every
    coefficient >= 0 (Lawson and Hanson's NNLS active set: a negative one is dropped and the
    rest refitted, on unit-norm columns); needs 8 steps. ValueError: too few steps or an
    unknown feature."""
    if len(steps) < 8:
        raise ValueError(f"calibration needs at least 8 steps, got {len(steps)}")
    unknown = [name for name in features if name not in FEATURES]
    if unknown or "intercept" not in features:
        raise ValueError(f"features: {unknown[0] if unknown else 'intercept'!r} "
                         f"(known: {', '.join(FEATURES)}; intercept is required)")
    shapes = [feedback_features(s) for s in steps]
    x_all = np.array([(1.0, *shape) for shape in shapes], dtype=np.float64)
    y = np.array([s.duration_s * 1e3 for s in steps], dtype=np.float64)
    columns = [FEATURES.index(name) for name in features]
    x = x_all[:, columns]
    norms = np.linalg.norm(x, axis=0)
    norms[norms == 0] = 1.0
    active = list(range(len(columns)))
    solved = np.zeros(len(columns))
    while active:
        solution, *_ = np.linalg.lstsq(x[:, active] / norms[active], y, rcond=None)
        if (solution >= 0).all():
            solved[:] = 0
            solved[active] = solution / norms[active]
            break
        active.pop(int(np.argmin(solution)))
    coef = np.zeros(len(FEATURES))
    coef[columns] = solved
    intercept, per_seq, per_prefill, per_context, per_pair = (float(c) for c in coef)
    return StepCostModel(intercept, per_seq, per_prefill, per_context, per_pair,
                         source=dict(source or {}),
                         fit=fit_summary(x_all, y, coef),
                         residuals=residuals_by_shape(shapes, y, x_all @ coef))


def _cv_rmse_ms(steps: Sequence[StepFeedback], features: Sequence[str], folds: int) -> float:
    """Root mean square error (ms) of ``features``' fit on steps it was not fitted on."""
    errors = []
    for k in range(folds):
        model = fit_steps([s for i, s in enumerate(steps) if i % folds != k], features=features)
        errors += [model.cost_ms(*feedback_features(s)) - s.duration_s * 1e3
                   for i, s in enumerate(steps) if i % folds == k]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def fit_profile(steps: Sequence[StepFeedback], source: dict[str, Any] | None = None,
                folds: int = 5) -> StepCostModel:
    """The calibration's fit: the linear terms, plus the prefill pair term only where it
    lowers the ``folds``-fold cross-validated error (steps dealt round robin into folds);
    ``fit`` gains ``cv_rmse_ms_linear`` and ``cv_rmse_ms_pairs``. ValueError: fewer than
    ``8 folds / (folds - 1)`` steps."""
    if len(steps) < math.ceil(8 * folds / (folds - 1)):
        raise ValueError(f"calibration needs at least {math.ceil(8 * folds / (folds - 1))} "
                         f"steps, got {len(steps)}")
    linear = FEATURES[:4]
    cv_linear = _cv_rmse_ms(steps, linear, folds)
    cv_pairs = _cv_rmse_ms(steps, FEATURES, folds)
    model = fit_steps(steps, source, FEATURES if cv_pairs < cv_linear else linear)
    return replace(model, fit={**model.fit, "cv_rmse_ms_linear": cv_linear,
                               "cv_rmse_ms_pairs": cv_pairs})
