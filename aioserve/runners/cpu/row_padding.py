"""Row padding: steps padded so a row's numbers never depend on the step's row count.

On the CPU, MKL's ``sgemm`` on plain float32 weights computes a call's last partial row group
with another kernel, and ATen's vectorised elementwise loops finish each thread's range with
scalar code that rounds differently; so a request's logits could depend on its batch-mates. Both
depend on the machine, so the exact row counts are probed at load (:func:`probe_row_padding`) and
steps padded with throw-away rows up to the next one. Where none is exact (``MKL_CBWR`` modes,
MKL's AVX2 path on AVX-512) the table says so (:attr:`RowPadding.exact`) and the runner takes its
products off MKL. oneDNN-packed products need no padding (in bfloat16 on AMX they are called in
fixed row blocks instead: ``packed_linear.bf16_row_block``)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aioserve.runners.cpu.packed_linear import PackedLinear, linear_pointwise, row_exact_counts

__all__ = ["GRAIN_SIZE", "PROBE_ROWS", "LinearProduct", "RowPadding", "elementwise_chunk",
           "probe_row_padding"]

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
        widths: widths of the ``[rows, width]`` tensors elementwise ops run over.
        chunk: floats per step of ATen's vectorised loops (1: no tail effect).
        exact: whether every count was made exact; ``reason`` says why not."""

    def __init__(self, targets: list[int], multiple: int = 1, widths: Iterable[int] = (),
                 chunk: int = 1, exact: bool = True, reason: str = "") -> None:
        self.targets = targets
        self.multiple = multiple
        self.widths = tuple(sorted(set(widths)))
        self.chunk = chunk
        self.exact = exact
        self.reason = reason

    def padded(self, rows: int) -> int:
        """The row count ``rows`` rows are computed as, at the calling thread's count."""
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
        """Whether every thread's range of a ``numel``-element op ends on a chunk boundary."""
        if numel <= GRAIN_SIZE or threads <= 1:
            return numel % self.chunk == 0
        used = min(threads, -(-numel // GRAIN_SIZE))
        return numel % self.chunk == 0 and (-(-numel // used)) % self.chunk == 0

    @property
    def needed(self) -> bool:
        return self.multiple > 1 or self.chunk > 1 or any(
            target != rows for rows, target in enumerate(self.targets))


def elementwise_chunk() -> int:
    """Floats ATen's vectorised loops take per step here, measured; 1 when paths agree."""
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


@dataclass(frozen=True)
class LinearProduct:
    """A product the probe measures: ``run(rows [n, in]) -> [n, out]``."""

    out_features: int
    in_features: int
    dtype: torch.dtype
    device: torch.device
    run: Callable[[torch.Tensor], torch.Tensor]
    packed: bool

    @classmethod
    def of(cls, layer: torch.Tensor | PackedLinear) -> LinearProduct:
        """A plain weight through ``F.linear``, or a packed layer's product (taken now)."""
        if isinstance(layer, PackedLinear):
            weight, packed, bias = layer.weight, layer.packed, layer.bias
            if packed is None:
                raise ValueError("a packed layer whose packed weight was released")
            run = functools.partial(linear_pointwise, packed=packed, bias=bias)
        else:
            weight = layer
            run = functools.partial(F.linear, weight=weight)
        return cls(int(weight.shape[0]), int(weight.shape[1]), weight.dtype, weight.device,
                   run, isinstance(layer, PackedLinear))


def _probe_rows(product: LinearProduct, max_rows: int) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(0)
    rows = torch.randn(4 * max_rows, product.in_features, generator=generator)
    return rows.to(device=product.device, dtype=product.dtype)


def probe_row_padding(weights: Iterable[torch.Tensor | LinearProduct],
                      max_rows: int = PROBE_ROWS, widths: Iterable[int] = ()) -> RowPadding:
    """The padding making each product's rows, and elementwise ops over ``[rows, width]``,
    independent of the row count: ``weights`` one per distinct shape in the model's device and
    dtype; counts up to ``max_rows`` probed one by one, then multiples of MKL's period up to ``4
    x max_rows``; ``widths`` besides the outputs (the rotary head width)."""
    shapes: dict[tuple[int, int, torch.dtype, bool], LinearProduct] = {}
    for weight in weights:
        product = weight if isinstance(weight, LinearProduct) else LinearProduct.of(weight)
        key = (product.out_features, product.in_features, product.dtype, product.packed)
        shapes.setdefault(key, product)
    if not shapes:  # packed models: their products' rows measured exact, nothing padded
        return RowPadding(list(range(max_rows + 1)))
    chunk = elementwise_chunk()
    widths = {*widths, *(product.out_features for product in shapes.values())}
    elementwise = math.lcm(1, *(chunk // math.gcd(chunk, w) for w in widths))
    small = range(1, max_rows + 1)
    exact = dict.fromkeys(small, True)
    with torch.inference_mode():
        for product in shapes.values():
            rows = _probe_rows(product, max_rows)
            for m, ok in row_exact_counts(product.run, small, rows).items():
                exact[m] = exact[m] and ok
        period = next((g for g in range(1, max_rows // 2 + 1)
                       if all(exact[m] for m in range(max_rows // 2 + 1, max_rows + 1)
                              if m % g == 0)), 0)
        multiple = math.lcm(period, elementwise) if period else elementwise
        large = sorted({-(-int(max_rows * f) // multiple) * multiple
                        for f in (1.01, 1.5, 2.2, 3.1, 3.9)} - {4 * max_rows})
        fixed = period > 0
        for product in shapes.values() if fixed else ():
            rows = _probe_rows(product, max_rows)
            fixed = fixed and all(row_exact_counts(product.run, large, rows).values())
    targets = [0]
    for m in small:
        target = next((t for t in range(m, max_rows + 1) if exact[t] and t % multiple == 0),
                      None)
        fixed = fixed and target is not None
        targets.append(target if target is not None else m)
    reason = ""
    if not fixed:
        kinds = sorted({"packed" if product.packed else "MKL's" for product in shapes.values()})
        reason = (f"some step sizes give rows other bits than alone on this machine "
                  f"({' and '.join(kinds)} products, chunk {chunk})")
    return RowPadding(targets, multiple, widths, chunk, fixed, reason)
