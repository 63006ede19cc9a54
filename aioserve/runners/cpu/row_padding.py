"""Row padding: small steps padded so every row's matrix products take the same kernel.

On the CPU, ``torch.nn.functional.linear`` on plain (not oneDNN-packed) float32
weights calls MKL's ``sgemm``, which computes rows in groups (four on the AVX2
development box) and the rows of a call's last partial group, in calls of fewer than
12 rows, with another kernel that sums in another order. A request's logits then
depended on how many tokens shared its step: on the test model, its decode logits
alone and beside 3+ others differed by up to 7e-6 (greedy tokens can flip on a
near-tie), where continuous batching must never change what a user gets.

The kernels' grouping depends on the machine, so it is probed at load: for each row
count ``m`` up to :data:`PROBE_ROWS`, the smallest count ``m' >= m`` whose every row
equals the same row computed in a large call, for each of the model's linear shapes,
and a multiple of :data:`ROW_MULTIPLE`: ATen's vectorised elementwise loops take 16
floats at a time (AVX2) and finish a tensor with scalar code, whose SiLU rounds
differently, so ``rows x width`` is kept a multiple of 16 for widths divisible by 4.
The runner then pads a step's tokens (and the rows it keeps for the logits) up to
that count with throw-away rows. That made decode and prefill steps exact on the test
model (tests/test_row_padding.py); a step of hundreds of tokens splits its elementwise
ops between threads at count-dependent points, which nothing here aligns. oneDNN's
packed products (big models, :mod:`~aioserve.runners.cpu.packed_linear`) need none: their
rows measured the same at every count, and no padding is done.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

__all__ = ["PROBE_ROWS", "ROW_MULTIPLE", "RowPadding", "probe_row_padding"]

#: Row counts probed (beyond, counts are only rounded up to ROW_MULTIPLE).
PROBE_ROWS = 64

#: Padded counts are multiples of this (see the module's text).
ROW_MULTIPLE = 4


class RowPadding:
    """How many rows a product of ``m`` rows is padded to (``padded(m) >= m``).

    Args:
        targets: ``targets[m]`` for ``m`` in ``0..len(targets) - 1``.
        multiple: counts past the table are rounded up to a multiple of it.
    """

    def __init__(self, targets: list[int], multiple: int = 1) -> None:
        self.targets = targets
        self.multiple = multiple

    def padded(self, rows: int) -> int:
        """The row count ``rows`` rows are computed as."""
        if rows < len(self.targets):
            return self.targets[rows]
        return -(-rows // self.multiple) * self.multiple

    @property
    def needed(self) -> bool:
        """Whether any count is padded at all."""
        return any(target != rows for rows, target in enumerate(self.targets))


def _row_exact_counts(weight: torch.Tensor, max_rows: int) -> list[bool]:
    """``exact[m]``: every row of an ``m``-row product with ``weight`` ``[out, in]``
    equals the same row of a ``4 * max_rows``-row product (random rows, fixed seed)."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    rows = torch.randn(4 * max_rows, weight.shape[1], generator=generator)
    rows = rows.to(device=weight.device, dtype=weight.dtype)
    reference = F.linear(rows, weight)
    return [True] + [torch.equal(F.linear(rows[:m], weight), reference[:m])
                     for m in range(1, max_rows + 1)]


def probe_row_padding(weights: Iterable[torch.Tensor], max_rows: int = PROBE_ROWS) -> RowPadding:
    """The padding that makes every row of each weight's products independent of the
    row count (up to ``max_rows`` rows; a count with no exact count above it within
    the probe is left as it is).

    Args:
        weights: the model's linear weights ``[out, in]`` (one per distinct shape is
            enough), on the device and in the dtype the model runs in.
    """
    shapes: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}
    for weight in weights:
        shapes.setdefault((int(weight.shape[0]), int(weight.shape[1]), weight.dtype), weight)
    exact = [True] * (max_rows + 1)
    with torch.inference_mode():
        for weight in shapes.values():
            exact = [a and b for a, b in zip(exact, _row_exact_counts(weight, max_rows))]
    if all(exact):
        return RowPadding(list(range(max_rows + 1)))
    targets = []
    for rows in range(max_rows + 1):
        target = next((m for m in range(rows, max_rows + 1)
                       if exact[m] and m % ROW_MULTIPLE == 0), rows)
        targets.append(target)
    return RowPadding(targets, ROW_MULTIPLE)
