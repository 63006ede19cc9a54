"""Linear products over weights stored in panels of 16 output columns (compiled, CPU).

A decode step's products read every weight of the model from memory once and use each
element for only as many rows as the step has (1-32). oneDNN's kernels
(:mod:`~aioserve.runners.cpu.packed_linear`) leave much of the memory bandwidth unused
there: on the 2-core development box, a 576 x 3072 weight (7 MB, not in cache) times
4 rows took 0.48 ms (about 15 GB/s of the box's 26), 32 rows 1.14 ms. The op in
``csrc/panel_linear.cpp`` stores a weight as panels of 16 output columns (``K x 16``
floats, contiguous), reads each panel once per chunk of rows while prefetching the
next, and holds tiles of up to 6 rows x 16 columns in vector registers: 0.31 ms and
1.04 ms on the same weight, 1,536 x 576 at 4 rows 0.29 -> 0.17 ms, at 32 rows 0.69
-> 0.44 ms; from a few hundred rows on (a prefill) the two are within noise.

Every output is a chain of fused multiply-adds over ``k`` from zero inside each block
of ``k_block`` inputs, the blocks' sums then added in order. That is how oneDNN's
float32 kernels add on AVX2 (measured: one chain for ``K`` up to 1,024; ``K`` = 1,536
as blocks of 1,024 and 512), so :func:`pack` picks ``k_block`` by comparing the two
products on the weight itself and keeps the panels only where they give oneDNN's bits
exactly: on the probe's rows, and so, as far as oneDNN's own rows do not depend on
their batch (measured, :mod:`~aioserve.runners.cpu.packed_linear`), tokens stay the same
whether or not the kernels build. A row's result
depends on its own inputs only (no tile shape or batch size enters its arithmetic), so
a row gets the same bits in any batch by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from aioserve.runners.cpu import native_kernels

__all__ = ["PANEL_COLUMNS", "PanelWeight", "available", "linear", "pack"]

#: Output columns per panel (two vectors of 8 floats).
PANEL_COLUMNS = 16

#: Block lengths tried after the whole ``K`` when matching oneDNN's sums.
K_BLOCKS = (1024, 512, 2048, 768, 256, 384, 128, 64)

#: Rows of the load-time comparison with oneDNN.
PROBE_ROWS = 8


class PanelWeight(NamedTuple):
    """A linear weight in panels: ``panels[p, k, j] = weight[16 p + j, k]``.

    Attributes:
        panels: ``[ceil(out / 16), in, 16]`` float32, zeros past the last output.
        out_features: the weight's outputs.
        k_block: inputs per block of each output's sum (see the module's text).
    """

    panels: torch.Tensor
    out_features: int
    k_block: int


def available() -> bool:
    """Whether the compiled panel product is loaded (x86 with AVX2 and FMA)."""
    return native_kernels.available() and hasattr(torch.ops.aioserve_cpu, "panel_linear")


def to_panels(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` float32 (any strides) -> panels ``[ceil(out / 16), in,
    16]``, contiguous, zeros past the last output.

    Raises:
        ValueError: ``weight`` is not two-dimensional.
    """
    out_features, in_features = weight.shape
    count = -(-out_features // PANEL_COLUMNS)
    padded = torch.nn.functional.pad(weight.contiguous(),
                                     (0, 0, 0, count * PANEL_COLUMNS - out_features))
    return padded.reshape(count, PANEL_COLUMNS, in_features).transpose(1, 2).contiguous()


def linear(
    rows: torch.Tensor, weight: PanelWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``rows @ weight.T + bias``: ``rows`` ``[n, in]`` float32 -> ``[n, out]`` float32
    (``bias`` ``[out]``, added after the sums, as oneDNN adds it).

    Raises:
        RuntimeError: ``rows`` is not 2-D float32, or its columns are not the
            weight's inputs (the message names ``rows`` or ``panels``).
    """
    out = torch.empty(rows.shape[0], weight.out_features, dtype=rows.dtype,
                      device=rows.device)
    torch.ops.aioserve_cpu.panel_linear(rows.contiguous(), weight.panels, out,
                                        weight.k_block)
    return out if bias is None else out.add_(bias)


def pack(
    weight: torch.Tensor, reference: Callable[[torch.Tensor], torch.Tensor],
    bias: torch.Tensor | None = None,
) -> PanelWeight | None:
    """``weight`` in panels, with the ``k_block`` under which the panel product (plus
    ``bias``) equals ``reference`` bit for bit on random rows.

    Args:
        weight: ``[out, in]`` float32.
        reference: ``rows [n, in] -> [n, out]``, the product to reproduce (the same
            weight and bias through oneDNN).
        bias: ``[out]`` float32, or None.

    Returns:
        The panels, or None: no block length reproduces ``reference``, the kernel is not
        loaded, or ``weight`` is not a non-empty float32 matrix.
    """
    if (not available() or weight.dtype != torch.float32 or weight.dim() != 2
            or 0 in weight.shape):
        return None
    in_features = weight.shape[1]
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(PROBE_ROWS, in_features, generator=generator, dtype=torch.float32)
    want = reference(rows)
    panels = to_panels(weight.detach())
    for k_block in (in_features, *(b for b in K_BLOCKS if b < in_features)):
        candidate = PanelWeight(panels, weight.shape[0], k_block)
        if torch.equal(linear(rows, candidate, bias), want):
            return candidate
    return None
