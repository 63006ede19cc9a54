"""CUDA-graph capture of decode steps, one graph per bucketed batch size (vLLM's capture sizes
and padding; PyTorch's "CUDA Graphs" recipe: side-stream warm-up, one shared pool, largest
first).

Inputs live in static buffers overwritten each step; padding rows feed token 0 at position 0 into
a reserved scratch slot and their logits are dropped. Only :meth:`DecodeGraphs.capture` and
:meth:`DecodeGraphs.replay` need CUDA."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from aioserve.runners.attention import layer_rules


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 8 up to ``max_num_seqs``."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
    sizes = [size for size in (1, 2, 4, 8) if size < max_num_seqs]
    sizes += range(16, max_num_seqs, 8)
    return [*sizes, max_num_seqs]


def bucket_for(batch: int, sizes: Sequence[int]) -> int | None:
    """The smallest of the sorted ``sizes`` that holds ``batch`` rows, or None."""
    index = bisect.bisect_left(sizes, batch)
    return sizes[index] if index < len(sizes) else None


@dataclass(frozen=True)
class PaddingPlan:
    """A batch of ``batch`` rows run as the graph of ``bucket`` rows."""

    batch: int
    bucket: int

    @property
    def pad_rows(self) -> range:
        return range(self.batch, self.bucket)


def padding_plan(batch: int, sizes: Sequence[int]) -> PaddingPlan | None:
    """The plan for ``batch`` rows, or None (empty, or no captured size holds it): run eagerly."""
    bucket = bucket_for(batch, sizes) if batch > 0 else None
    return None if bucket is None else PaddingPlan(batch, bucket)


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step's B rows of inputs (int64 ids, positions, slots; int32 tables, lengths)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor

    @classmethod
    def allocate(
        cls, rows: int, width: int, device: torch.device, pin_memory: bool = False
    ) -> DecodeInputs:
        """Zeroed buffers of ``rows`` x ``width`` blocks (pinned with ``pin_memory``)."""
        def make(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory)

        return cls(make(rows, dtype=torch.int64), make(rows, dtype=torch.int64),
                   make(rows, dtype=torch.int64), make(rows, width, dtype=torch.int32),
                   make(rows, dtype=torch.int32))

    def narrow(self, rows: int) -> DecodeInputs:
        return DecodeInputs(*(getattr(self, f.name)[:rows] for f in fields(self)))

    def copy_(self, source: DecodeInputs, non_blocking: bool = False) -> None:
        for f in fields(self):
            getattr(self, f.name).copy_(getattr(source, f.name), non_blocking=non_blocking)


def stage_rows(
    host: DecodeInputs, plan: PaddingPlan, input_ids: list[int], positions: list[int],
    block_tables: list[list[int]], block_size: int, scratch_block: int,
) -> None:
    """Write the step's rows, then padding rows, into the first ``plan.bucket`` rows of ``host``."""
    n, width = plan.batch, int(host.block_table.shape[1])
    tables = host.block_table.numpy()
    for row, table in enumerate(block_tables):
        if len(table) > width:
            raise ValueError(f"block table of {len(table)} blocks exceeds the graphs' {width}")
        tables[row, : len(table)] = table
    pos = np.asarray(positions, dtype=np.int64)
    if np.any(pos // block_size >= [len(t) for t in block_tables]):
        raise ValueError("a block table does not reach its row's position")
    host.input_ids.numpy()[:n] = input_ids
    host.positions.numpy()[:n] = pos
    host.slot_mapping.numpy()[:n] = tables[np.arange(n), pos // block_size] * block_size \
        + pos % block_size
    host.seq_lens.numpy()[:n] = pos + 1
    pad = slice(n, plan.bucket)
    host.input_ids.numpy()[pad] = 0
    host.positions.numpy()[pad] = 0
    host.slot_mapping.numpy()[pad] = scratch_block * block_size
    tables[pad] = scratch_block
    host.seq_lens.numpy()[pad] = 1


def model_decode_forward(
    model: torch.nn.Module, backend: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    block_size: int, windows: tuple[int, ...],
) -> Callable[[DecodeInputs], torch.Tensor]:
    """``forward(inputs) -> logits [B, vocab]`` over static inputs (graph-safe)."""

    def forward(inputs: DecodeInputs) -> torch.Tensor:
        meta = backend.decode_metadata(kv_caches, inputs.slot_mapping, inputs.block_table,
                                       inputs.seq_lens, block_size, windows)
        with layer_rules.metadata_context(meta):
            logits: torch.Tensor = model(
                input_ids=inputs.input_ids[None], position_ids=inputs.positions[None],
                use_cache=False, paged_metadata=meta).logits[0]
            return logits

    return forward


class DecodeGraphs:
    """Static buffers, their pinned staging, and one graph per size."""

    def __init__(self, max_batch: int, width: int, block_size: int, scratch_block: int,
                 device: torch.device, sizes: Sequence[int] | None = None) -> None:
        self.sizes = list(sizes) if sizes is not None else capture_sizes(max_batch)
        self.block_size, self.scratch_block, self.device = block_size, scratch_block, device
        cuda = device.type == "cuda"
        self.static = DecodeInputs.allocate(max_batch, width, device)
        self.host = DecodeInputs.allocate(max_batch, width, torch.device("cpu"), pin_memory=cuda)
        padding = PaddingPlan(0, max_batch)  # every row valid padding, for warm-up and capture
        stage_rows(self.host, padding, [], [], [], block_size, scratch_block)
        self.static.copy_(self.host)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._copied = torch.cuda.Event() if cuda else None  # recorded after each staging copy

    def stage(self, input_ids: list[int], positions: list[int],
              block_tables: list[list[int]]) -> PaddingPlan | None:
        """Fill and copy the pinned rows; None when no bucket holds the batch."""
        plan = padding_plan(len(input_ids), self.sizes)
        if plan is None:
            return None
        if self._copied is not None:  # the previous copy must have read the pinned rows
            self._copied.synchronize()
        stage_rows(self.host, plan, input_ids, positions, block_tables, self.block_size,
                   self.scratch_block)
        self.static.narrow(plan.bucket).copy_(self.host.narrow(plan.bucket), non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        return plan

    @torch.inference_mode()
    def capture(self, forward: Callable[[DecodeInputs], torch.Tensor], warmup: int = 2) -> None:
        """Capture ``forward`` for every size; RuntimeError when the buffers are not on CUDA."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need the static buffers on a CUDA device")
        order = sorted(self.sizes, reverse=True)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up (and compilation) outside any capture
            for size in order:
                for _ in range(warmup):
                    forward(self.static.narrow(size))
        torch.cuda.current_stream(self.device).wait_stream(side)
        pool = torch.cuda.graph_pool_handle()
        for size in order:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = forward(self.static.narrow(size))
            self._graphs[size] = (graph, logits)

    def replay(self, plan: PaddingPlan) -> torch.Tensor:
        """Logits ``[plan.batch, vocab]``, valid until the next replay."""
        graph, logits = self._graphs[plan.bucket]
        graph.replay()
        return logits[: plan.batch]
