"""bfloat16 linear products on AMX tiles (compiled, CPU): a row's bits never depend on how many
rows share the call, so prefill runs as one call at AMX's speed where oneDNN's AMX kernels need
fixed 32-row blocks (:func:`packed_linear.bf16_row_block`) to stay batch invariant.

Each output is TDPBF16PS over its inputs 32 at a time, in order, in float32, rounded once to
bfloat16 (``csrc/amx_linear.cpp``). Weights whose inputs are a multiple of 32 and outputs a
multiple of 16, without a bias (Llama's), are packed this way; others keep oneDNN."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from aioserve.runners.cpu import native_kernels

__all__ = ["AmxWeight", "available", "linear", "pack"]

#: Inputs per tile (16 bfloat16 pairs) and outputs per tile.
TILE_INPUTS, TILE_OUTPUTS = 32, 16


class AmxWeight(NamedTuple):
    """A weight in AMX tiles: ``packed[n, k, p, j, e] = weight[16 n + j, 32 k + 2 p + e]``."""

    packed: torch.Tensor
    out_features: int


def available() -> bool:
    """Whether the compiled AMX product is loaded (the compiler targeted AMX-BF16 here) and runs:
    the OS lends this process AMX tiles (tried once a process)."""
    return (native_kernels.available() and hasattr(torch.ops.aioserve_cpu, "amx_linear")
            and _runs())


@functools.cache
def _runs() -> bool:
    weight = torch.eye(TILE_OUTPUTS, TILE_INPUTS, dtype=torch.bfloat16)
    rows = torch.arange(2 * TILE_INPUTS, dtype=torch.bfloat16).view(2, TILE_INPUTS)
    out = rows.new_empty((2, TILE_OUTPUTS))
    try:
        torch.ops.aioserve_cpu.amx_linear(rows, _tiles(weight), out)
    except RuntimeError:
        return False
    return torch.equal(out, rows[:, :TILE_OUTPUTS])


def _tiles(weight: torch.Tensor) -> torch.Tensor:
    out_features, in_features = weight.shape
    tiles = weight.detach().contiguous().view(out_features // TILE_OUTPUTS, TILE_OUTPUTS,
                                              in_features // TILE_INPUTS, TILE_INPUTS // 2, 2)
    return tiles.permute(0, 2, 3, 1, 4).contiguous()


def pack(weight: torch.Tensor, bias: torch.Tensor | None = None) -> AmxWeight | None:
    """``weight`` ``[out, in]`` bfloat16 in AMX tiles, or None where the kernel does not serve
    it (not loaded, another dtype, a bias, or a shape off the tiles)."""
    if (not available() or weight.dtype != torch.bfloat16 or bias is not None
            or weight.dim() != 2 or weight.device.type != "cpu"):
        return None
    out_features, in_features = weight.shape
    if out_features % TILE_OUTPUTS or in_features % TILE_INPUTS or 0 in weight.shape:
        return None
    return AmxWeight(_tiles(weight), out_features)


def linear(rows: torch.Tensor, weight: AmxWeight) -> torch.Tensor:
    """``rows @ weight.T``: ``[n, in]`` bfloat16 -> ``[n, out]`` bfloat16; RuntimeError for
    other shapes or where the OS lends no AMX tiles."""
    out = rows.new_empty((int(rows.shape[0]), weight.out_features))
    torch.ops.aioserve_cpu.amx_linear(rows.contiguous(), weight.packed, out)
    return out
