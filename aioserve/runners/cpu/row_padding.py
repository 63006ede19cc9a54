"""Row padding: steps padded so a row's numbers never depend on the step's row count.

On the CPU, ``torch.nn.functional.linear`` on plain (not oneDNN-packed) float32
weights calls MKL's ``sgemm``, which computes rows in groups (four on the AVX2
development box) and the rows of a call's last partial group, in calls of fewer than
12 rows, with another kernel that sums in another order. ATen's vectorised elementwise
loops take ``2 x`` a vector of floats at a time (16 with AVX2, 32 with AVX-512, found by
:func:`elementwise_chunk`) and finish a tensor with scalar code, whose SiLU (exp, sin,
...) rounds differently; a tensor of more than ``GRAIN_SIZE`` elements is first cut
into one contiguous range per thread, and each range has such a tail. A request's
logits then depended on how many tokens shared its step: on the test model, its decode
logits alone and beside 3+ others differed by up to 7e-6 (greedy tokens can flip on a
near-tie), where continuous batching must never change what a user gets.

All of this depends on the machine (ISA, MKL's code path, thread count), so it is
measured at load, never assumed: for each row count ``m`` up to :data:`PROBE_ROWS`, the
smallest count ``m' >= m`` whose every row equals the same row computed in a large
call, for each of the model's linear shapes (larger counts: multiples of MKL's period,
checked up to ``4 x PROBE_ROWS``), with ``m' x width`` a multiple of the elementwise
chunk for every width an elementwise op runs over (the linear outputs', the head
width); at each step, the count also grows until every thread's range of such an op
ends on a chunk boundary (:meth:`RowPadding.padded`, at the step's thread count). The
runner pads a step's tokens (and the rows it keeps for the logits) up to that count
with throw-away rows. Where no count is exact (e.g. ``MKL_CBWR=COMPATIBLE``), the
table says so (:attr:`RowPadding.exact` False) and a warning is logged. oneDNN's
packed products (big models, :mod:`~aioserve.runners.cpu.packed_linear`) need none:
their rows measured the same at every count, and no padding is done.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F

__all__ = ["GRAIN_SIZE", "PROBE_ROWS", "RowPadding", "elementwise_chunk", "probe_row_padding"]

logger = logging.getLogger(__name__)

#: Row counts probed one by one (beyond, multiples of the period are checked).
PROBE_ROWS = 64

#: Elements past which ATen splits an elementwise op between threads
#: (``at::internal::GRAIN_SIZE``).
GRAIN_SIZE = 32768


class RowPadding:
    """How many rows a step of ``m`` rows is computed as (``padded(m) >= m``).

    Args:
        targets: ``targets[m]`` for ``m`` in ``0..len(targets) - 1``.
        multiple: counts past the table are rounded up to a multiple of it.
        widths: widths of the tensors elementwise ops run over (``[rows, width]``).
        chunk: floats per step of ATen's vectorised loops (1: no tail effect).
        exact: whether every count was made exact (False: the probe found counts it
            could not fix; logits may then depend on batch-mates in the last bits).
    """

    def __init__(self, targets: list[int], multiple: int = 1, widths: Iterable[int] = (),
                 chunk: int = 1, exact: bool = True) -> None:
        self.targets = targets
        self.multiple = multiple
        self.widths = tuple(sorted(set(widths)))
        self.chunk = chunk
        self.exact = exact

    def padded(self, rows: int) -> int:
        """The row count ``rows`` rows are computed as, at the calling thread's
        intra-op thread count."""
        if rows < len(self.targets):
            rows = self.targets[rows]
        else:
            rows = -(-rows // self.multiple) * self.multiple
        if self.chunk > 1 and self.widths and rows * self.widths[-1] > GRAIN_SIZE:
            threads = torch.get_num_threads()
            for _ in range(4096):  # a multiple of chunk x threads always ends the search
                if all(self._split_aligned(rows * w, threads) for w in self.widths):
                    break
                rows += self.multiple
        return rows

    def _split_aligned(self, numel: int, threads: int) -> bool:
        """Whether every thread's range of an ``numel``-element op (at::parallel_for's
        split: ``ceil(numel / used)`` each) ends on a chunk boundary."""
        if numel <= GRAIN_SIZE or threads <= 1:
            return numel % self.chunk == 0
        used = min(threads, -(-numel // GRAIN_SIZE))
        return numel % self.chunk == 0 and (-(-numel // used)) % self.chunk == 0

    @property
    def needed(self) -> bool:
        """Whether any count is padded at all."""
        return self.multiple > 1 or self.chunk > 1 or any(
            target != rows for rows, target in enumerate(self.targets))


def elementwise_chunk() -> int:
    """Floats ATen's vectorised elementwise loops take per step on this machine (two
    vectors: 16 with AVX2, 32 with AVX-512), measured: elements whose vector and scalar
    SiLU differ, tiled, give a length whose result matches the long tensor's only at
    multiples of the chunk. 1 when the two paths agree (``ATEN_CPU_CAPABILITY=default``)."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    values = 8 * torch.rand(512, generator=generator) - 4
    vector = F.silu(values)
    scalar = torch.cat([F.silu(values[i:i + 1]) for i in range(len(values))])
    differing = values[vector != scalar]
    if len(differing) == 0:
        return 1
    tiled = differing.repeat(-(-4096 // len(differing)))[:4096]
    full = F.silu(tiled)
    for length in range(1, 513):
        if torch.equal(F.silu(tiled[:length]), full[:length]):
            return length
    return 512


def _row_exact_counts(weight: torch.Tensor, counts: Iterable[int],
                      rows: torch.Tensor) -> dict[int, bool]:
    """``exact[m]``: every row of an ``m``-row product with ``weight`` ``[out, in]``
    equals the same row of the product of all of ``rows``."""
    reference = F.linear(rows, weight)
    return {m: torch.equal(F.linear(rows[:m], weight), reference[:m]) for m in counts}


def probe_row_padding(weights: Iterable[torch.Tensor], max_rows: int = PROBE_ROWS,
                      widths: Iterable[int] = ()) -> RowPadding:
    """The padding that makes every row of each weight's products, and of the
    elementwise ops over ``[rows, width]`` tensors, independent of the row count.

    Args:
        weights: the model's linear weights ``[out, in]`` (one per distinct shape is
            enough), on the device and in the dtype the model runs in.
        max_rows: counts probed one by one; past it, five counts up to ``4 x max_rows``
            that are multiples of MKL's period are checked.
        widths: widths elementwise ops run over besides the weights' outputs (the
            rotary tables' head width).
    """
    shapes: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}
    for weight in weights:
        shapes.setdefault((int(weight.shape[0]), int(weight.shape[1]), weight.dtype), weight)
    if not shapes:  # packed models: their products' rows measured exact, nothing padded
        return RowPadding(list(range(max_rows + 1)))
    chunk = elementwise_chunk()
    widths = {*widths, *(shape[0] for shape in shapes)}
    elementwise = math.lcm(1, *(chunk // math.gcd(chunk, w) for w in widths))
    small = range(1, max_rows + 1)
    exact = dict.fromkeys(small, True)
    with torch.inference_mode():
        for weight in shapes.values():
            generator = torch.Generator(device="cpu").manual_seed(0)
            rows = torch.randn(4 * max_rows, weight.shape[1], generator=generator)
            rows = rows.to(device=weight.device, dtype=weight.dtype)
            for m, ok in _row_exact_counts(weight, small, rows).items():
                exact[m] = exact[m] and ok
        period = next((g for g in range(1, max_rows // 2 + 1)
                       if all(exact[m] for m in range(max_rows // 2 + 1, max_rows + 1)
                              if m % g == 0)), 0)
        multiple = math.lcm(period, elementwise) if period else elementwise
        large = sorted({-(-int(max_rows * f) // multiple) * multiple
                        for f in (1.01, 1.5, 2.2, 3.1, 3.9)} - {4 * max_rows})
        fixed = period > 0
        for weight in shapes.values() if fixed else ():
            generator = torch.Generator(device="cpu").manual_seed(0)
            rows = torch.randn(4 * max_rows, weight.shape[1], generator=generator)
            rows = rows.to(device=weight.device, dtype=weight.dtype)
            fixed = fixed and all(_row_exact_counts(weight, large, rows).values())
    targets = [0]
    for m in small:
        target = next((t for t in range(m, max_rows + 1) if exact[t] and t % multiple == 0),
                      None)
        fixed = fixed and target is not None
        targets.append(target if target is not None else m)
    if not fixed:
        logger.warning("row padding: some step sizes give rows other bits than alone on this "
                       "machine (MKL's products, chunk %d): a request's logits may depend on "
                       "its batch-mates in the last bits", chunk)
    return RowPadding(targets, multiple, widths, chunk, fixed)
