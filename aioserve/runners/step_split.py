"""Splitting one CPU step into parts that run side by side, one core each.

A small model's step on the CPU is mostly per-op overhead: a few microseconds for
each of a few hundred aten ops, paid once per forward whatever the batch size, on
one core. More intra-op threads do not spread that overhead; they add an OpenMP
barrier to every tiny op, which costs milliseconds when a core is busy with the
event loop. Instead the runner cuts the batch into disjoint parts of about equal
work and runs one traced forward per part, each in its own thread (the traced
forward runs without the GIL), meeting once at the end of the step.

A sequence attends only to its own keys, so which part it lands in changes nothing
but the summation order inside the linear layers' matrix products (as any batch
size does); the logits are put back in batch order before sampling, so the sampler
draws in the same order as for an unsplit step.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from aioserve.runners.base import ScheduledBatch
from aioserve.runners.decode_metadata import int64_tensor

if TYPE_CHECKING:
    from aioserve.runners.traced import TracedDecode

#: Work of one new token relative to one context position it attends (a token
#: passes every linear layer; a context position costs one key and one value read).
TOKEN_COST = 200

#: Least work (in :func:`row_cost` units, about 0.3 microseconds each on a small
#: model) worth a second part: below it, the part's fixed cost is not repaid.
MIN_SPLIT_COST = 2_400


def row_cost(new_tokens: int, seq_len: int) -> int:
    """Estimated work of one sequence's step: ``TOKEN_COST`` per new token plus its
    context length in tokens (the prefill attention of a chunk grows as new tokens x
    context, which the linear layers dominate at the lengths a CPU serves)."""
    return TOKEN_COST * new_tokens + seq_len


def step_parts(device: torch.device) -> int:
    """How many parts a CPU step is cut into: ``AIOSERVE_STEP_PARTS``, else 2 on a
    machine with at least 2 cores, else 1 (no split). Always 1 off the CPU."""
    if device.type != "cpu":
        return 1
    env = os.environ.get("AIOSERVE_STEP_PARTS")
    if env:
        return max(1, int(env))
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def split_rows(
    counts: list[int], start_positions: list[int], num_parts: int, min_cost: int | None = None
) -> list[list[int]] | None:
    """Assign the batch's rows to parts of about equal work.

    Rows are placed heaviest first, each on the part with the least work so far
    (longest-processing-time rule, Graham 1969); each part keeps batch order.

    Args:
        counts: new tokens per row.
        start_positions: position of each row's first new token.
        num_parts: most parts wanted.
        min_cost: least total work for each extra part (default ``MIN_SPLIT_COST``).

    Returns:
        Row indices per part (two or more non-empty parts), or None when the step
        is too small or has a single row.
    """
    costs = [TOKEN_COST * c + s + c for c, s in zip(counts, start_positions)]  # row_cost
    least = MIN_SPLIT_COST if min_cost is None else max(1, min_cost)
    parts = min(num_parts, len(counts), sum(costs) // least + 1)
    if parts < 2:
        return None
    members: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for row in sorted(range(len(costs)), key=costs.__getitem__, reverse=True):
        lightest = loads.index(min(loads))
        members[lightest].append(row)
        loads[lightest] += costs[row]
    return [sorted(rows) for rows in members]


def merge_logits(
    parts: list[list[int]], logits: list[torch.Tensor], sample: list[bool]
) -> torch.Tensor:
    """The parts' logits as one ``[K, vocab]`` tensor, rows in batch order.

    Args:
        parts: row indices per part (from :func:`split_rows`).
        logits: per part, ``[k_part, vocab]`` for its sampled rows in order (a part
            without a sampled row gives any one row, ignored).
        sample: per batch row, whether it is sampled.
    """
    if len(parts) == 1:
        return logits[0]
    order: list[int] = []
    kept: list[torch.Tensor] = []
    for rows, part_logits in zip(parts, logits):
        sampled = [row for row in rows if sample[row]]
        if sampled:
            order.extend(sampled)
            kept.append(part_logits)
    merged = torch.cat(kept)
    rank = sorted(range(len(order)), key=order.__getitem__)
    if rank == list(range(len(order))):
        return merged
    return merged.index_select(0, torch.tensor(rank, device=merged.device))


@dataclass(frozen=True)
class StepPart:
    """The rows of a step that one forward runs, with their inputs.

    Attributes:
        rows: indices into the batch, in batch order.
        token_ids, start_positions, block_tables: those rows' entries of the batch.
        keep: ``[k]`` int64, packed-token index of each sampled row's last new token
            (the first token's when no row is sampled: one unused row of logits).
        traced_args: the traced forward's arguments, or None for the eager forward.
    """

    rows: list[int]
    token_ids: list[list[int]]
    start_positions: list[int]
    block_tables: list[list[int]]
    keep: torch.Tensor
    traced_args: tuple[torch.Tensor, ...] | None

    @classmethod
    def of(
        cls, batch: ScheduledBatch, rows: list[int], traced: TracedDecode | None,
        device: torch.device,
    ) -> StepPart:
        """The part of ``batch`` made of ``rows``, its traced inputs built when a trace fits."""
        token_ids = [batch.token_ids[i] for i in rows]
        starts = [batch.start_positions[i] for i in rows]
        tables = [batch.block_tables[i] for i in rows]
        ends = list(itertools.accumulate(len(t) for t in token_ids))  # past each row's last
        kept = [ends[j] - 1 for j, i in enumerate(rows) if batch.sample[i]]
        keep = int64_tensor(kept or [ends[0] - 1]).to(device)
        args = None
        if traced is not None:
            if len(rows) == ends[-1]:  # pure decode: one token per row
                args = traced.inputs([t[0] for t in token_ids], starts, tables, keep)
            else:
                args = traced.mixed_inputs(token_ids, starts, tables, keep)
        return cls(rows, token_ids, starts, tables, keep, args)
