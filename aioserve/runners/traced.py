"""Traced decode steps: the model's forward without Python overhead, on the CPU.

On a small model on the CPU a decode step is dominated by per-op Python overhead
(module calls, decorators, config look-ups), not arithmetic. ``torch.jit.trace``
records the aten ops of a pure-decode forward (every sequence feeds one token; one
attention group, or two when the batch is split by context length; masks always
given) and replays them without the Python, and without holding the GIL, so the
event loop's work overlaps the step. The ops and their order are unchanged, so the
logits are bitwise those of the eager forward. Any model runs: each trace is checked
against the eager forward at two shapes when it is made, and a model whose trace
fails or differs keeps the eager path. Mixed (decode + prefill) and prefill-only
steps have traces of their own; other layouts run eagerly.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from aioserve.runners import lean_llama, paged_metadata
from aioserve.runners.decode_metadata import decode_metadata, int64_tensor
from aioserve.runners.layer_rules import metadata_context
from aioserve.runners.lean_llama import LeanLlama
from aioserve.runners.paged_metadata import AttentionGroup, PagedAttentionMetadata, build_metadata

logger = logging.getLogger(__name__)

#: Never split: one decode group.
NO_SPLIT = 1 << 62

#: Structure key of the mixed trace: one decode group and one prefill group.
MIXED = 3

#: Structure key of the prefill trace: one prefill group holding every row.
PREFILL = 4

#: Structure of a traced forward, by its number of arguments.
_STRUCTURE_OF_ARITY = {6: 1, 10: 2, 12: MIXED, 8: PREFILL}


class GroupLayout:
    """Turns a traced forward's group tensors into attention groups, for one structure:
    one (gather_blocks, mask) pair for a single decode group, (token_index,
    gather_blocks, mask) triples for several, the mixed layout (a decode triple, then
    a prefill group's five tensors), or a lone prefill group's (gather_blocks, mask,
    query_index, query_valid)."""

    def __init__(self, structure: int) -> None:
        self.structure = structure

    def __call__(self, tensors: tuple[torch.Tensor, ...]) -> tuple[AttentionGroup, ...]:
        if self.structure == 1:
            return (AttentionGroup(None, tensors[0], tensors[1], None, None),)
        if self.structure == MIXED:
            return (AttentionGroup(*tensors[:3], None, None), AttentionGroup(*tensors[3:]))
        if self.structure == PREFILL:
            return (AttentionGroup(None, *tensors),)
        return tuple(
            AttentionGroup(*tensors[i : i + 3], None, None) for i in range(0, len(tensors), 3)
        )


class _DecodeForward(torch.nn.Module):
    """The model's own forward over plain tensors (what ``torch.jit.trace`` can
    record); the group tensors follow :class:`GroupLayout`."""

    def __init__(
        self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int, num_groups: int,
    ) -> None:
        super().__init__()
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.num_groups = num_groups
        self.make_groups = GroupLayout(num_groups)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor,
        slot_mapping: torch.Tensor, *group_tensors: torch.Tensor,
    ) -> torch.Tensor:
        groups = self.make_groups(group_tensors)
        meta = PagedAttentionMetadata(self.kv_caches, slot_mapping, groups, self.block_size)
        with metadata_context(meta):  # for models that drop kwargs on the way to attention
            return self.model(
                input_ids=input_ids, position_ids=position_ids, use_cache=False,
                logits_to_keep=keep, paged_metadata=meta,
            ).logits


def trace_enabled(device: torch.device) -> bool:
    """Tracing is on for the CPU unless ``AIOSERVE_TRACE=0``."""
    return device.type == "cpu" and os.environ.get("AIOSERVE_TRACE", "1") != "0"


class TracedDecode:
    """Pure-decode forwards recorded once with ``torch.jit.trace`` (one and two groups).

    Args:
        model: the loaded causal LM (attention implementation: aioserve's paged one).
        kv_caches: the runner's KV cache (the traces write into these tensors).
        block_size: tokens per KV block.
        device: the model's device.

    Attributes:
        ready: True when the one-group trace exists and matched the eager forward.
    """

    def __init__(
        self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int, device: torch.device,
    ) -> None:
        self._model = model
        self._block_size = block_size
        self._kv_caches = kv_caches
        self._device = device
        self._traced: dict[int, Any] = {}
        self.ready = False
        self.use_lean = lean_llama.supports(model) and os.environ.get("AIOSERVE_LEAN", "1") != "0"
        self.lean: dict[int, bool] = {}

    def inputs(
        self, token_ids: list[int], start_positions: list[int], block_tables: list[list[int]],
        keep: torch.Tensor, split_cost: int | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """The traced forward's arguments for a pure-decode batch: split in two groups
        when that saves work and a two-group trace exists (``split_cost`` None), or as
        :func:`~aioserve.runners.paged_metadata.split_by_length` decides for the cost."""
        if split_cost is None:
            split_cost = paged_metadata.SPLIT_COST if 2 in self._traced else NO_SPLIT
        positions, slot_mapping, groups = decode_metadata(
            start_positions, block_tables, self._block_size, self._kv_caches[0][0].dtype,
            split_cost,
        )
        ids = int64_tensor(token_ids).unsqueeze(0)
        head = (ids, positions.unsqueeze(0), keep, slot_mapping)
        if len(groups) == 1:
            return (*head, groups[0].gather_blocks, groups[0].mask)
        return head + tuple(t for g in groups for t in (g.token_index, g.gather_blocks, g.mask))

    def mixed_inputs(
        self, token_ids: list[list[int]], start_positions: list[int],
        block_tables: list[list[int]], keep: torch.Tensor,
    ) -> tuple[torch.Tensor, ...] | None:
        """Arguments of the mixed trace (decode rows and prefill rows, unsplit) or of
        the prefill trace (prefill rows only), or None when no trace fits the batch."""
        structure, args = self._prefill_args(token_ids, start_positions, block_tables, keep)
        return args if structure in self._traced else None

    def _prefill_args(
        self, token_ids: list[list[int]], start_positions: list[int],
        block_tables: list[list[int]], keep: torch.Tensor,
    ) -> tuple[int | None, tuple[torch.Tensor, ...]]:
        """(MIXED or PREFILL, the trace's arguments), or (None, ()) for other layouts."""
        counts = [len(t) for t in token_ids]
        meta, positions = build_metadata(
            self._kv_caches, start_positions, counts, block_tables, self._block_size,
            self._device, split_cost=NO_SPLIT, always_mask=True,
        )
        ids = int64_tensor([t for tokens in token_ids for t in tokens]).unsqueeze(0)
        head = (ids, positions.unsqueeze(0), keep, meta.slot_mapping)
        groups = meta.groups
        if len(groups) == 1 and groups[0].query_index is not None:
            only = groups[0]
            tail: tuple[Any, ...] = (only.gather_blocks, only.mask, only.query_index,
                                     only.query_valid)
            return PREFILL, (*head, *tail)
        if len(groups) != 2 or groups[0].query_index is not None:
            return None, ()
        decode, prefill = groups
        return MIXED, (
            *head, decode.token_index, decode.gather_blocks, decode.mask,
            prefill.token_index, prefill.gather_blocks, prefill.mask,
            prefill.query_index, prefill.query_valid,
        )

    @property
    def has_mixed(self) -> bool:
        """True when mixed decode + prefill steps and prefill-only steps can use a trace."""
        return MIXED in self._traced and PREFILL in self._traced

    def prepare(self) -> bool:
        """Trace and check each structure at two shapes (writing only to KV blocks
        0-3, before any request holds them). Returns :attr:`ready`."""
        size = self._block_size
        if self._kv_caches[0][0].shape[0] // size < 4:
            return False

        def case(positions: list[int], keep: list[int]) -> tuple[Any, ...]:
            tables = [[(r + i) % 4 for i in range(p // size + 1)] for r, p in enumerate(positions)]
            tokens = [5 + 7 * row for row in range(len(positions))]
            return tokens, positions, tables, keep

        def mixed_case(starts: list[int], counts: list[int], keep: list[int]) -> Any:
            tables = [[(r + i) % 4 for i in range((s + c - 1) // size + 1)]
                      for r, (s, c) in enumerate(zip(starts, counts))]
            tokens = [[5 + 7 * r + j for j in range(c)] for r, c in enumerate(counts)]
            return tokens, starts, tables, torch.tensor(keep)

        probes = {  # (tokens, positions, block tables, kept rows) at two shapes each
            1: [case([1, 3], [0, 1]), case([size + 2], [0])],
            2: [case([1, 2, 3 * size + 1, 3 * size + 3], [0, 1, 2, 3]),
                case([0, 1, 2, 4 * size, 2 * size + 3], [0, 2, 4])],
        }
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # transformers' notes while tracing are noise here
        try:
            for groups, cases in probes.items():
                args = [self.inputs(t, s, b, torch.tensor(k), split_cost=0) for t, s, b, k in cases]
                traced = self._trace(groups, args)
                if traced is None:
                    break
                self._traced[groups] = traced
            if 1 in self._traced:
                self._trace_prefill(MIXED, [
                    mixed_case([size + 1, 0], [1, 3], [0, 1]),
                    mixed_case([2, 3, 2 * size + 2], [4, 1, 1], [0, 1, 2]),
                ])
                self._trace_prefill(PREFILL, [
                    mixed_case([0, size + 1], [3, 2], [2, 4]),
                    mixed_case([2, 0, 5], [4, size + 3, 2], [3, size + 6, size + 8]),
                ])
        finally:
            hf_logging.set_verbosity(verbosity)
        self.ready = 1 in self._traced
        return self.ready

    def _trace_prefill(self, structure: int, cases: list[Any]) -> None:
        """Trace the MIXED or PREFILL structure, checked on ``cases``."""
        made = [self._prefill_args(*case) for case in cases]
        if all(kind == structure for kind, _ in made):
            traced = self._trace(structure, [args for _, args in made])
            if traced is not None:
                self._traced[structure] = traced

    def _trace(self, structure: int, probes: list[tuple[torch.Tensor, ...]]) -> Any:
        """The first candidate forward for ``structure`` whose trace gives the model's
        eager logits bit for bit on every probe (:class:`LeanLlama` where supported,
        then the model's own forward), or None."""
        eager = _DecodeForward(self._model, self._kv_caches, self._block_size, structure)
        candidates: list[torch.nn.Module] = [eager]
        if self.use_lean:
            layout = GroupLayout(structure)
            candidates.insert(0, LeanLlama(self._model, self._kv_caches, self._block_size, layout))
        for candidate in candidates:
            traced = self._trace_one(candidate, eager, probes)
            if traced is not None:
                self.lean[structure] = isinstance(candidate, LeanLlama)
                return traced
        return None

    @staticmethod
    def _trace_one(
        candidate: torch.nn.Module, eager: _DecodeForward, probes: list[tuple[torch.Tensor, ...]]
    ) -> Any:
        name = type(candidate).__name__
        try:
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(candidate, probes[0], check_trace=False, strict=False)
                for args in probes + probes:  # twice: past the profiling runs
                    if not torch.equal(traced(*args), eager(*args)):
                        logger.info("traced %s (structure %d) differs", name, eager.num_groups)
                        return None
        except Exception as exc:  # any model the tracer cannot record stays eager
            logger.info("cannot trace %s (%s)", name, exc)
            return None
        return traced

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        """Logits ``[1, K, vocab]`` for the arguments from :meth:`inputs`."""
        return self._traced[_STRUCTURE_OF_ARITY[len(args)]](*args)
