"""StepCostModel: an engine step's cost as a linear function of its batch, fitted on real steps.

    cost = intercept + per_seq * rows + per_prefill_token * prefill tokens
           + per_context_token * context tokens read

The roofline split Vidur's and vLLM's performance models use: per step (launches, host
work), per row (sampling, attention set-up), per token fed (linear layers), per KV
position read (attention). A real step's cost is its period, start to end."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from aioserve.runners.base import ScheduledBatch
from aioserve.scheduling import StepFeedback

#: The features' names, in the order of the coefficients.
FEATURES = ("intercept", "per_seq", "per_prefill_token", "per_context_token")


def batch_features(batch: ScheduledBatch) -> tuple[int, int, int]:
    """(rows, prefill tokens, context tokens) of a batch."""
    prefill = context = 0
    for count, start, produced in zip(batch.num_scheduled_tokens, batch.start_positions,
                                      batch.num_output_tokens):
        if not (count == 1 and produced > 0):
            prefill += count
        context += start + count
    return len(batch.request_ids), prefill, context


def feedback_features(step: StepFeedback) -> tuple[int, int, int]:
    """(rows, prefill tokens, context tokens) of a finished step."""
    return step.num_seqs, step.num_prefill_tokens, step.num_context_tokens


@dataclass(frozen=True)
class StepCostModel:
    """Milliseconds per step as a linear function of the batch (coefficients >= 0, in ms).

    ``source`` says what it was fitted on; ``fit`` its quality on its own records
    (``steps``, ``r2``, ``mean_abs_error_ms``, ``total_error_pct``)."""

    intercept_ms: float
    per_seq_ms: float = 0.0
    per_prefill_token_ms: float = 0.0
    per_context_token_ms: float = 0.0
    source: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, float] = field(default_factory=dict)

    def cost_ms(self, rows: int, prefill: int, context: int) -> float:
        return (self.intercept_ms + self.per_seq_ms * rows
                + self.per_prefill_token_ms * prefill + self.per_context_token_ms * context)

    def batch_cost_ms(self, batch: ScheduledBatch) -> float:
        return self.cost_ms(*batch_features(batch))

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
        for name in set(known) - set(coefficients):
            if not isinstance(data.get(name, {}), dict):
                raise ValueError(f"{name} must be a JSON object, got {data[name]!r}")
        return cls(**data)


def fit_steps(steps: Sequence[StepFeedback], source: dict[str, Any] | None = None
              ) -> StepCostModel:
    """Least-squares fit on real steps, every coefficient >= 0 (Lawson and Hanson's NNLS
    active set: a negative one is dropped and the rest refitted); needs 8 steps."""
    if len(steps) < 8:
        raise ValueError(f"calibration needs at least 8 steps, got {len(steps)}")
    x = np.array([(1.0, *feedback_features(s)) for s in steps], dtype=np.float64)
    y = np.array([s.duration_s * 1e3 for s in steps], dtype=np.float64)
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        solution, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (solution >= 0).all():
            coef[:] = 0
            coef[active] = solution
            break
        active.pop(int(np.argmin(solution)))
    predicted = x @ coef
    residual = y - predicted
    total = float(((y - y.mean()) ** 2).sum())
    fit = {
        "steps": float(len(steps)),
        "r2": 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0,
        "mean_abs_error_ms": float(np.abs(residual).mean()),
        "total_error_pct": 100.0 * float(predicted.sum() - y.sum()) / float(y.sum()),
    }
    intercept, per_seq, per_prefill, per_context = (float(c) for c in coef)
    return StepCostModel(intercept, per_seq, per_prefill, per_context,
                         source=dict(source or {}), fit=fit)
