"""Batch invariance: a request's greedy tokens in any batch equal its tokens alone.

One policy with one switch, ``EngineConfig.batch_invariant`` (``--batch-invariant`` /
``--no-batch-invariant``), on by default, as a serving engine's users expect of greedy
decoding (vLLM's ``VLLM_BATCH_INVARIANT``, SGLang's deterministic inference). On the
CPU a kernel's summation order can depend on a call's shape, that is on how many rows
and keys share a step, so a request's logits could depend on its batch-mates (on the
test model by up to 7e-6: a greedy token flips on a near-tie). The switch governs the
two measures that cost time and exist only for this:

* **Row padding** (:mod:`~aioserve.runners.cpu.row_padding`): at load the runner probes
  the model's plain (MKL) linear shapes for the row counts whose every row is exact, and
  pads each step's tokens and kept rows up to the next such count (one-token throw-away
  sequences in a scratch block). Off: no probe, no padding.
* **The context floor** (:data:`MIN_CONTEXT_WIDTH`): every attention group of the
  reference backend spans at least 32 key columns (the padding masked), since MKL
  computed narrower score products with another kernel. Off: a group spans its
  longest context only.

What holds either way, because it is how the fast paths are built and costs nothing
extra: the compiled decode-attention kernel, the sparse decode kernels and the batched
products sum each (sequence, head) in a fixed order of its own context; oneDNN-packed
and panel products compute a row the same in a call of any row count (packed models
need no row padding); the sampler's draws are a counter-based hash of (seed, output
index, token id), never of a row.

Cost (test model, ``aioserve bench throughput --model stories260K-hf --num-prompts 64
--input-len 8:128 --output-len 16:256 --max-num-seqs 32 --runs 3 --forward
lean-llama``, on against off in alternating processes on the shared 2-core box, medians
of output tokens/s): see docs/ARCHITECTURE.md ("Batch invariance"). Off suits
throughput-bound sampling workloads where bit-equal greedy tokens across batches do not
matter.
"""

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
    """The batch-invariance policy (see the module docstring).

    Attributes:
        enabled: ``EngineConfig.batch_invariant``.
    """

    enabled: bool = True

    @property
    def min_context_width(self) -> int:
        """Fewest key columns (tokens) an attention group spans: 32 on, 1 off."""
        return MIN_CONTEXT_WIDTH if self.enabled else 1

    def row_padding(self, weights: Iterable[torch.Tensor | LinearProduct],
                    device: torch.device, widths: Iterable[int] = ()) -> RowPadding:
        """How a step's rows are padded: probed from the model's linear ``weights`` (plain
        weights, or packed layers' products: see
        :func:`~aioserve.runners.cpu.row_padding.probe_row_padding`) and the elementwise
        ``widths`` (the rotary tables' head width) on the CPU when on; no padding when
        off or off the CPU."""
        if not self.enabled or device.type != "cpu":
            return RowPadding([])
        return probe_row_padding(weights, widths=widths)
