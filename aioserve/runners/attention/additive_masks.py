"""Additive attention masks built in numpy: 0 where a query may attend a key, ``-inf`` elsewhere
(transformers' convention)."""

from __future__ import annotations

import numpy as np

__all__ = ["visible_prefix", "window_mask"]

_PREFIX_MASKS = np.zeros((1, 0), dtype=np.float32)


def visible_prefix(lengths: np.ndarray, width: int) -> np.ndarray:
    """``[len(lengths), width]`` float32: row i is 0 at its first ``lengths[i]`` positions,
    ``-inf`` after."""
    global _PREFIX_MASKS
    if _PREFIX_MASKS.shape[1] < width:  # row i: -inf from column i on
        _PREFIX_MASKS = np.triu(np.full((width + 1, width), -np.inf, dtype=np.float32))
    return _PREFIX_MASKS[np.minimum(lengths, width), :width]


def window_mask(query_pos: np.ndarray, width: int, window: int) -> np.ndarray:
    """``[b, 1, Q, width]`` float32 sliding-window mask: 0 where ``p - window < k <= p`` for
    ``query_pos`` ``[b, Q]``."""
    keys = np.arange(width)[None, None, :]
    pos = query_pos[:, :, None]
    allowed = (keys <= pos) & (keys > pos - window)
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))[:, None]
