"""Additive attention masks built in numpy on the host: a sequence's visible prefix
(its context in a padded group) and a sliding window. 0 where a query may attend a
key, ``-inf`` elsewhere (transformers' convention)."""

from __future__ import annotations

import numpy as np

__all__ = ["visible_prefix", "window_mask"]

_PREFIX_MASKS = np.zeros((1, 0), dtype=np.float32)


def visible_prefix(lengths: np.ndarray, width: int) -> np.ndarray:
    """``[len(lengths), width]`` float32 additive mask: row i is 0 at the first
    ``lengths[i]`` positions (all of them past ``width``) and ``-inf`` after (rows
    of a table grown on demand)."""
    global _PREFIX_MASKS
    if _PREFIX_MASKS.shape[1] < width:  # row i: -inf from column i on
        _PREFIX_MASKS = np.triu(np.full((width + 1, width), -np.inf, dtype=np.float32))
    return _PREFIX_MASKS[np.minimum(lengths, width), :width]


def window_mask(query_pos: np.ndarray, width: int, window: int) -> np.ndarray:
    """``[b, 1, Q, width]`` float32 additive mask of a sliding window: 0 where key
    position k satisfies ``p - window < k <= p`` for query position p
    (``query_pos`` ``[b, Q]``), ``-inf`` elsewhere (transformers' convention)."""
    keys = np.arange(width)[None, None, :]
    pos = query_pos[:, :, None]
    allowed = (keys <= pos) & (keys > pos - window)
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))[:, None]
