"""How well a policy predicted output lengths: Kendall's tau of the orders, mean absolute error."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def kendall_tau(predicted: Sequence[float], true: Sequence[float]) -> float | None:
    """Kendall's tau-b between two rankings (Kendall 1945: ties in either count in neither
    concordant nor discordant pairs); None with fewer than two items or no untied pair."""
    x, y = np.asarray(predicted, dtype=float), np.asarray(true, dtype=float)
    if len(x) != len(y):
        raise ValueError("predicted and true lengths differ in count")
    score = untied_x = untied_y = 0
    for i in range(len(x) - 1):
        dx, dy = np.sign(x[i + 1:] - x[i]), np.sign(y[i + 1:] - y[i])
        score += int(np.dot(dx, dy))
        untied_x += int(np.count_nonzero(dx))
        untied_y += int(np.count_nonzero(dy))
    if not untied_x or not untied_y:
        return None
    return score / math.sqrt(untied_x * untied_y)


def mean_absolute_error(predicted: Sequence[float], true: Sequence[float]) -> float | None:
    """Mean |predicted - true| in tokens; None when empty."""
    if not predicted:
        return None
    return math.fsum(abs(p - t) for p, t in zip(predicted, true, strict=True)) / len(predicted)
