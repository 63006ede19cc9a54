"""Linear layers on pre-packed weights (oneDNN's, or compiled panels), for float32
forwards on the CPU.

``torch.nn.functional.linear`` on the CPU calls MKL's ``sgemm`` with the weight as
stored; for the small row counts of a decode step (tens of tokens) it reaches about
half of what oneDNN reaches on a weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, then ``_linear_pointwise``, ops torch
ships for Inductor). Measured on the 2-core development box (AVX2), 32 rows,
SmolLM2-135M's shapes: q/k/v 68 -> 71, gate 39 -> 96, down 61 -> 75, lm_head
43 -> 111 GFLOP/s. There, oneDNN's row results also did not depend on how many rows
were in the call (1 to 1,000, 1 to 4 threads), where MKL's did; oneDNN picks its
blocking per shape and machine, so this is a measured property, not a promise.

Where the compiled kernels load (x86 with AVX2 and FMA), a packed weight is kept in
panels of 16 output columns instead (:mod:`~aioserve.runners.cpu.panel_linear`), whose
product gives oneDNN's bits (checked per weight at packing) and streams a decode step's
weights from memory faster; the oneDNN copy is then dropped.

oneDNN pays a fixed cost per call (25-60 us measured, against 3-20 us for MKL on a
64 x 172 weight), so a small model, whose step is mostly such calls, is not packed:
on the test model (292,800 parameters) packing cut the engine's output rate from
about 2,000 to 1,400 tokens/s. Each ``torch.nn.Linear`` keeps its dense weight
(transformers reads ``.weight`` for tying, dtypes and devices), so packing costs one
more copy of the linear weights.
"""

from __future__ import annotations

import torch

from aioserve.runners.cpu import panel_linear
from aioserve.runners.cpu.panel_linear import PanelWeight

__all__ = ["PackedLinear", "PackedWeight", "available", "can_pack", "linear_parameters",
           "linear_pointwise", "pack_linears", "pack_weight"]

#: Row count oneDNN is told to expect when it picks the packed layout (a decode step).
EXPECTED_ROWS = 32

#: Parameters from which a model's linear layers are packed (see the module's text).
MIN_PARAMETERS = 20_000_000


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model's linear layers can be packed: float32 on the CPU, with oneDNN
    in this torch."""
    return (device.type == "cpu" and dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def available(device: torch.device, dtype: torch.dtype, num_parameters: int) -> bool:
    """Whether packing applies for speed: :func:`can_pack`, and the linear layers hold
    at least :data:`MIN_PARAMETERS` parameters."""
    return num_parameters >= MIN_PARAMETERS and can_pack(device, dtype)


def linear_parameters(model: torch.nn.Module) -> int:
    """Weights of ``model``'s ``torch.nn.Linear`` layers, in parameters (a tied
    lm_head counts)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


#: A packed weight: oneDNN's blocked layout (an opaque tensor) or compiled panels.
PackedWeight = torch.Tensor | PanelWeight


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedWeight:
    """``weight`` ``[out, in]`` float32 packed for :func:`linear_pointwise`: in panels
    (:mod:`~aioserve.runners.cpu.panel_linear`) where those give oneDNN's bits (with
    ``bias``, if the layer adds one), else reordered into oneDNN's blocked layout."""
    onednn = torch.ops.mkldnn._reorder_linear_weight(weight, EXPECTED_ROWS)
    panels = panel_linear.pack(weight, lambda rows: linear_pointwise(rows, onednn, bias), bias)
    return onednn if panels is None else panels


def linear_pointwise(
    rows: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``rows @ weight.T + bias``: ``rows`` ``[n, in]`` float32 -> ``[n, out]``."""
    if isinstance(packed, PanelWeight):
        return panel_linear.linear(rows, packed, bias)
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out


class PackedLinear(torch.nn.Module):
    """A ``torch.nn.Linear``'s forward on its weight packed (:func:`pack_weight`: compiled
    panels or oneDNN's layout).

    Args:
        linear: the layer (float32, CPU); it stays the owner of ``weight`` and ``bias``.
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.packed: PackedWeight | None = pack_weight(
            linear.weight.detach(), None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., in_features]`` float32 -> ``[..., out_features]``.

        Raises:
            RuntimeError: the packed weight was handed over (:meth:`release`).
        """
        if self.packed is None:
            raise RuntimeError("this layer's packed weight was released (the lean forward "
                               "holds it fused)")
        rows = x.reshape(-1, self.in_features)
        out = linear_pointwise(rows, self.packed, self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def release(self) -> None:
        """Drop the packed copy (a fused copy elsewhere replaces it); the dense
        weight stays."""
        self.packed = None

    def extra_repr(self) -> str:
        kind = "panels" if isinstance(self.packed, PanelWeight) else "oneDNN"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind} packed"


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every float32 ``torch.nn.Linear`` of ``model`` (in place) by a
    :class:`PackedLinear`; returns how many were replaced. Call only where
    :func:`available` holds. The packed copy is taken now: later in-place changes of
    ``.weight`` do not reach the forward."""
    targets = [(parent, name, child)
               for parent in model.modules()
               for name, child in parent.named_children()
               if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    return len(targets)
