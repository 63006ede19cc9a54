"""Linear products over weights in panels of 16 output columns (compiled, CPU), streaming a
decode step's weights faster than oneDNN.

Each output is a fused multiply-add chain inside blocks of ``k_block`` inputs, the blocks summed
in order: oneDNN's float32 order on AVX2, so :func:`pack` keeps panels only where they reproduce
oneDNN's bits, and tokens do not depend on whether the kernels built. No tile or batch size
enters a row's arithmetic, so rows are batch-invariant by construction."""

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
    """A weight in panels: ``panels[p, k, j] = weight[16 p + j, k]``, zeros past the end."""

    panels: torch.Tensor
    out_features: int
    k_block: int


def available() -> bool:
    """Whether the compiled panel product is loaded (x86 with AVX2 and FMA)."""
    return native_kernels.available() and hasattr(torch.ops.aioserve_cpu, "panel_linear")


def to_panels(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` float32 as contiguous panels; ValueError when not 2-D."""
    out_features, in_features = weight.shape
    count = -(-out_features // PANEL_COLUMNS)
    padded = torch.nn.functional.pad(weight.contiguous(),
                                     (0, 0, 0, count * PANEL_COLUMNS - out_features))
    return padded.reshape(count, PANEL_COLUMNS, in_features).transpose(1, 2).contiguous()


def linear(
    rows: torch.Tensor, weight: PanelWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``rows @ weight.T + bias`` (bias after the sums, as oneDNN): ``[n, in]`` -> ``[n, out]``."""
    out = torch.empty(rows.shape[0], weight.out_features, dtype=rows.dtype,
                      device=rows.device)
    torch.ops.aioserve_cpu.panel_linear(rows.contiguous(), weight.panels, out,
                                        weight.k_block)
    return out if bias is None else out.add_(bias)


def pack(
    weight: torch.Tensor, reference: Callable[[torch.Tensor], torch.Tensor],
    bias: torch.Tensor | None = None,
) -> PanelWeight | None:
    """``weight`` in panels whose product equals ``reference`` bit for bit, or None."""
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
