"""Linear layers on pre-packed float32 or bfloat16 CPU weights: compiled AMX tiles for bfloat16
where they build and fit (:mod:`amx_linear`), oneDNN's blocked layout (faster than MKL's
``sgemm`` at decode row counts, and its rows measured the same at any row count; in bfloat16 its
AVX512-BF16/AMX kernels, where the CPU has them, called in fixed row blocks where AMX makes a
row's bits depend on the count: :func:`bf16_row_block`), or compiled float32 panels where they
give oneDNN's bits. Small models are not packed: oneDNN's per-call cost
outweighs the gain. Each layer keeps its dense weight (transformers reads ``.weight``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import torch

from aioserve.runners.cpu import amx_linear, panel_linear
from aioserve.runners.cpu.amx_linear import AmxWeight
from aioserve.runners.cpu.panel_linear import PanelWeight

__all__ = ["PACKED_DTYPES", "PackedLinear", "PackedWeight", "available", "bf16_row_block",
           "can_pack", "linear_parameters", "linear_pointwise", "native_bf16", "pack_linears",
           "pack_weight", "row_exact_counts"]

#: Row count oneDNN is told to expect when it picks the packed layout (a decode step).
EXPECTED_ROWS = 32

#: Weight dtypes packed (bfloat16 only where :func:`native_bf16`).
PACKED_DTYPES = (torch.float32, torch.bfloat16)

#: Parameters from which a model's linear layers are packed (see the module's text).
MIN_PARAMETERS = 20_000_000


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Float32, or bfloat16 where oneDNN runs it natively, on the CPU with oneDNN in this torch."""
    return (device.type == "cpu" and dtype in PACKED_DTYPES
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and (dtype == torch.float32 or native_bf16()))


def native_bf16() -> bool:
    """Whether oneDNN runs bfloat16 products on bfloat16 instructions here (AVX512-BF16, AMX)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check is not None and check())


def row_exact_counts(product: Callable[[torch.Tensor], torch.Tensor], counts: Iterable[int],
                      rows: torch.Tensor) -> dict[int, bool]:
    """``exact[m]`` for each ``m`` in ``counts`` (each at most ``n``): ``product`` (``[m, in]``
    -> ``[m, out]``) over the first ``m`` of ``rows`` (``[n, in]``) gives, bit for bit, the
    first ``m`` rows of its output over all ``n``."""
    reference = product(rows)
    return {m: torch.equal(product(rows[:m]), reference[:m]) for m in counts}


#: (out, in) shapes :func:`bf16_row_block` measures: square, wide, a long reduction, a head.
_BLOCK_PROBE_SHAPES = ((576, 576), (1536, 576), (576, 1536), (8192, 576))


@functools.cache
def bf16_row_block() -> int:
    """Rows per oneDNN bfloat16 call: 0 where a row's bits came out the same at every row
    count (1-64 against 96, as with AVX512-BF16 kernels), else :data:`EXPECTED_ROWS`. With
    AMX, oneDNN picks its kernel and blocking by a call's row count, and a row's bits follow;
    each call then gets exactly that many rows (padded with zeros), so they never depend on
    the batch. Measured once a process, on :data:`_BLOCK_PROBE_SHAPES` at the current thread
    count; the model's own shapes are probed again at load (``runners/cpu/row_padding.py``)."""
    if not native_bf16():
        return 0
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for out_features, in_features in _BLOCK_PROBE_SHAPES:
            weight = torch.randn(out_features, in_features, generator=generator) / 32
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), EXPECTED_ROWS)
            rows = torch.randn(96, in_features, generator=generator).bfloat16()
            product = functools.partial(_onednn, packed=packed, bias=None)
            if not all(row_exact_counts(product, range(1, 65), rows).values()):
                return EXPECTED_ROWS
    return 0


def _onednn(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out


def _blocked(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
             block: int) -> torch.Tensor:
    """oneDNN's product in calls of exactly ``block`` rows, the last padded with zeros."""
    count = rows.shape[0]
    if count == block:
        return _onednn(rows, packed, bias)
    pad = -count % block
    if pad:
        rows = torch.cat((rows, rows.new_zeros(pad, rows.shape[1])))
    parts = [_onednn(rows[start:start + block], packed, bias)
             for start in range(0, rows.shape[0], block)]
    return (parts[0] if len(parts) == 1 else torch.cat(parts))[:count]


def available(device: torch.device, dtype: torch.dtype, num_parameters: int) -> bool:
    """:func:`can_pack` and at least :data:`MIN_PARAMETERS` linear parameters."""
    return num_parameters >= MIN_PARAMETERS and can_pack(device, dtype)


def linear_parameters(model: torch.nn.Module) -> int:
    """Parameters of ``model``'s ``torch.nn.Linear`` layers (a tied lm_head counts)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


#: A packed weight: oneDNN's blocked layout (an opaque tensor), compiled panels (float32) or
#: AMX tiles (bfloat16).
PackedWeight = torch.Tensor | PanelWeight | AmxWeight


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedWeight:
    """``weight`` packed for :func:`linear_pointwise`: AMX tiles, else panels, else oneDNN's
    layout."""
    tiles = amx_linear.pack(weight, bias)
    if tiles is not None:
        return tiles
    onednn = torch.ops.mkldnn._reorder_linear_weight(weight, EXPECTED_ROWS)
    panels = panel_linear.pack(weight, lambda rows: linear_pointwise(rows, onednn, bias), bias)
    return onednn if panels is None else panels


def linear_pointwise(
    rows: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``rows @ weight.T + bias``: ``rows`` ``[n, in]`` in the weight's dtype -> ``[n, out]``."""
    if isinstance(packed, PanelWeight):
        return panel_linear.linear(rows, packed, bias)
    if isinstance(packed, AmxWeight):  # no bias: pack_weight keeps biased weights on oneDNN
        return amx_linear.linear(rows, packed)
    if rows.dtype == torch.bfloat16 and (block := bf16_row_block()):
        return _blocked(rows, packed, bias, block)
    return _onednn(rows, packed, bias)


class PackedLinear(torch.nn.Module):
    """A ``torch.nn.Linear``'s forward on its packed weight."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.packed: PackedWeight | None = pack_weight(
            linear.weight.detach(), None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` -> ``[..., out_features]``; RuntimeError after :meth:`release`."""
        if self.packed is None:
            raise RuntimeError("this layer's packed weight was released (the lean forward "
                               "holds it fused)")
        rows = x.reshape(-1, self.in_features)
        out = linear_pointwise(rows, self.packed, self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def release(self) -> None:
        """Drop the packed copy (a fused one replaces it); the dense weight stays."""
        self.packed = None

    def extra_repr(self) -> str:
        kind = ("panels" if isinstance(self.packed, PanelWeight)
                else "AMX tiles" if isinstance(self.packed, AmxWeight) else "oneDNN")
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind} packed"


def pack_linears(model: torch.nn.Module) -> int:
    """Replace each float32 or bfloat16 ``torch.nn.Linear`` of ``model`` by a
    :class:`PackedLinear`."""
    targets = [(parent, name, child)
               for parent in model.modules()
               for name, child in parent.named_children()
               if type(child) is torch.nn.Linear and child.weight.dtype in PACKED_DTYPES]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    return len(targets)
