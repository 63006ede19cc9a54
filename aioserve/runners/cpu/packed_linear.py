"""Linear layers on pre-packed float32 or bfloat16 CPU weights: oneDNN's blocked layout (faster
than MKL's ``sgemm`` at decode row counts, and its rows measured the same at any row count; in
bfloat16 its AVX512-BF16/AMX kernels, where the CPU has them), or compiled float32 panels where
they give oneDNN's bits. Small models are not packed: oneDNN's per-call cost
outweighs the gain. Each layer keeps its dense weight (transformers reads ``.weight``)."""

from __future__ import annotations

import torch

from aioserve.runners.cpu import panel_linear
from aioserve.runners.cpu.panel_linear import PanelWeight

__all__ = ["PACKED_DTYPES", "PackedLinear", "PackedWeight", "available", "can_pack",
           "linear_parameters", "linear_pointwise", "native_bf16", "pack_linears", "pack_weight"]

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


def available(device: torch.device, dtype: torch.dtype, num_parameters: int) -> bool:
    """:func:`can_pack` and at least :data:`MIN_PARAMETERS` linear parameters."""
    return num_parameters >= MIN_PARAMETERS and can_pack(device, dtype)


def linear_parameters(model: torch.nn.Module) -> int:
    """Parameters of ``model``'s ``torch.nn.Linear`` layers (a tied lm_head counts)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


#: A packed weight: oneDNN's blocked layout (an opaque tensor) or compiled panels.
PackedWeight = torch.Tensor | PanelWeight


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedWeight:
    """``weight`` packed for :func:`linear_pointwise`: panels, else oneDNN's layout."""
    onednn = torch.ops.mkldnn._reorder_linear_weight(weight, EXPECTED_ROWS)
    panels = panel_linear.pack(weight, lambda rows: linear_pointwise(rows, onednn, bias), bias)
    return onednn if panels is None else panels


def linear_pointwise(
    rows: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``rows @ weight.T + bias``: ``rows`` ``[n, in]`` in the weight's dtype -> ``[n, out]``."""
    if isinstance(packed, PanelWeight):
        return panel_linear.linear(rows, packed, bias)
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out


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
        kind = "panels" if isinstance(self.packed, PanelWeight) else "oneDNN"
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
