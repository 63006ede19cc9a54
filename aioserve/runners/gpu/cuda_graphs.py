"""CUDA-graph capture of decode steps, one graph per bucketed batch size.

A decode step's kernels are launched from Python one by one; a CUDA graph replays
the whole forward as one launch. Graphs need static addresses and shapes, so the
inputs live in static device buffers (:class:`DecodeInputs`) that each step
overwrites in place, and the batch is padded to the smallest captured size that
holds it (vLLM's cudagraph capture sizes and padding, ``vllm/config``). Padding rows
feed token 0 at position 0 and write their K/V into a scratch slot (slot 0 of a
block the runner reserves for this), attend only that slot, and their logits are
dropped. The capture follows the PyTorch docs ("CUDA Graphs", ``torch.cuda.graph``):
warm-up runs on a side stream first, graphs share one memory pool
(``torch.cuda.graph_pool_handle``), captured largest first.

The pure logic (sizes, bucket choice, padding plan, staging of the host rows) runs
anywhere; :meth:`DecodeGraphs.capture` and :meth:`DecodeGraphs.replay` need CUDA.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from aioserve.runners.attention import layer_rules


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 8 up to ``max_num_seqs``, which
    is always the last (so every batch up to it has a bucket).

    Raises:
        ValueError: ``max_num_seqs`` below 1.
    """
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
        """Rows of the static buffers that hold padding."""
        return range(self.batch, self.bucket)


def padding_plan(batch: int, sizes: Sequence[int]) -> PaddingPlan | None:
    """The plan for ``batch`` rows, or None when no captured size holds them (or
    the batch is empty): run that step eagerly."""
    bucket = bucket_for(batch, sizes) if batch > 0 else None
    return None if bucket is None else PaddingPlan(batch, bucket)


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step's inputs, B rows (static buffers or their host staging).

    Attributes:
        input_ids: ``[B]`` int64 token fed by each row.
        positions: ``[B]`` int64 its position.
        slot_mapping: ``[B]`` int64 cache slot its K/V is written to.
        block_table: ``[B, W]`` int32 its KV blocks (the first
            ``ceil(seq_len / block_size)`` columns are read).
        seq_lens: ``[B]`` int32 its context length including the new token.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor

    @classmethod
    def allocate(
        cls, rows: int, width: int, device: torch.device, pin_memory: bool = False
    ) -> DecodeInputs:
        """Zeroed buffers of ``rows`` rows and ``width`` blocks (pinned host memory
        with ``pin_memory``, for asynchronous copies to the GPU)."""
        def make(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory)

        return cls(make(rows, dtype=torch.int64), make(rows, dtype=torch.int64),
                   make(rows, dtype=torch.int64), make(rows, width, dtype=torch.int32),
                   make(rows, dtype=torch.int32))

    def narrow(self, rows: int) -> DecodeInputs:
        """Views of the first ``rows`` rows (same storage)."""
        return DecodeInputs(*(getattr(self, f.name)[:rows] for f in fields(self)))

    def copy_(self, source: DecodeInputs, non_blocking: bool = False) -> None:
        """Copy ``source`` (same shapes) into these buffers."""
        for f in fields(self):
            getattr(self, f.name).copy_(getattr(source, f.name), non_blocking=non_blocking)


def stage_rows(
    host: DecodeInputs, plan: PaddingPlan, input_ids: list[int], positions: list[int],
    block_tables: list[list[int]], block_size: int, scratch_block: int,
) -> None:
    """Write the step's rows and its padding rows into the first ``plan.bucket`` rows
    of the CPU buffers ``host``; padding rows feed token 0 at position 0 into slot 0
    of ``scratch_block``, with a table of that block only.

    Raises:
        ValueError: a table wider than the buffers or missing its position's block.
    """
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
    """A ``forward(inputs) -> logits [B, vocab]`` of ``model`` over static inputs,
    attending through ``backend.decode_metadata`` (graph-safe, e.g.
    :class:`~aioserve.runners.attention.flex.backend.FlexBackend`)."""

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
    """Static buffers, their pinned host staging, and one graph per captured size.

    Args:
        max_batch: rows of the buffers (``max_num_seqs``).
        width: blocks per row (``ceil(max_model_len / block_size)``).
        block_size: tokens per block.
        scratch_block: a KV block the runner never hands out; padding rows write there.
        device: where the static buffers live (graphs need CUDA).
        sizes: batch sizes to capture (default :func:`capture_sizes`), sorted.
    """

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
        """Fill the pinned rows and start their copy to the static buffers (on the
        current stream, so later work on it sees them); None: no bucket holds the
        batch, nothing staged."""
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
        """Capture ``forward`` over the first s rows of the static buffers, for every
        size s (the buffers then hold padding rows: only the scratch slot is written).

        Raises:
            RuntimeError: the buffers are not on a CUDA device.
        """
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
        """Replay the bucket's graph; logits ``[plan.batch, vocab]`` of the real rows,
        a view of the graph's output: valid until the next replay of any graph."""
        graph, logits = self._graphs[plan.bucket]
        graph.replay()
        return logits[: plan.batch]
