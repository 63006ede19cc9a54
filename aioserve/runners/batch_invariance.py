"""Batch invariance: a request's greedy tokens in any batch equal its tokens alone.

One switch, ``EngineConfig.batch_invariant`` (on by default, as vLLM's ``VLLM_BATCH_INVARIANT``),
governs the two measures that cost time: row padding (:mod:`~aioserve.runners.cpu.row_padding`)
and the reference backend's context floor (:data:`MIN_CONTEXT_WIDTH`, since MKL computes narrower
score products with another kernel). The compiled and sparse decode kernels, packed products and
the sampler's hash are invariant by construction either way."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from aioserve.runners.cpu.row_padding import LinearProduct, RowPadding, probe_row_padding

__all__ = ["MIN_CONTEXT_WIDTH", "BatchInvariance"]

#: Fewest key columns a group attends over when the policy is on (padding masked): MKL
#: computes the score products of narrower contexts with another kernel, so a sequence
#: of 16 or fewer tokens got other bits alone than beside a longer batch-mate
#: (measured, AVX2).
MIN_CONTEXT_WIDTH = 32


@dataclass(frozen=True)
class BatchInvariance:
    """The batch-invariance policy; ``enabled`` is ``EngineConfig.batch_invariant``."""

    enabled: bool = True

    @property
    def min_context_width(self) -> int:
        """Fewest key columns an attention group spans: 32 on, 1 off."""
        return MIN_CONTEXT_WIDTH if self.enabled else 1

    def row_padding(self, weights: Iterable[torch.Tensor | LinearProduct],
                    device: torch.device, widths: Iterable[int] = ()) -> RowPadding:
        """The row padding probed on the CPU when on; none otherwise."""
        if not self.enabled or device.type != "cpu":
            return RowPadding([])
        return probe_row_padding(weights, widths=widths)
