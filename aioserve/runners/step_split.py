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
import threading
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
    """Estimated work of one sequence's step, padded to a context of ``seq_len``:
    per new token, ``TOKEN_COST`` (the linear layers) plus one unit per context
    position it attends."""
    return (TOKEN_COST + seq_len) * new_tokens


def cpu_layout(device: torch.device, can_split: bool) -> tuple[int, int | None]:
    """(parts a step is cut into, intra-op threads of each part's forward).

    The model's thread budget is ``AIOSERVE_NUM_THREADS``, else the machine's cores.
    With the traced forward (``can_split``), a step runs in ``AIOSERVE_STEP_PARTS``
    parts, else in ``min(2, budget)``; the parts share the budget less one thread for
    the event loop, at least one thread each (on 2 cores: 2 parts of 1 thread). Without
    it, one forward uses the budget, one core less by default. The event loop keeps a
    core because OpenMP threads waiting at a barrier for a descheduled one cost
    milliseconds per tiny op. Off the CPU: one part, torch's own threads (None).
    """
    if device.type != "cpu":
        return 1, None
    cores = os.cpu_count() or 1
    budget = env_count("AIOSERVE_NUM_THREADS")
    if not can_split:
        return 1, budget or max(1, cores - 1)
    total = budget or cores
    parts = env_count("AIOSERVE_STEP_PARTS") or min(2, total)
    return parts, max(1, (total - 1) // parts)


def env_count(name: str) -> int | None:
    """A positive integer from the environment variable ``name`` (None when unset).

    Raises:
        ValueError: the value is not a positive integer (the message names the variable).
    """
    value = os.environ.get(name)
    if not value:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def split_rows(
    counts: list[int], start_positions: list[int], num_parts: int, min_cost: int | None = None
) -> list[list[int]] | None:
    """Cut the batch's rows into parts of about equal work, by context length.

    Rows are sorted by context length and the run is cut where the costlier side is
    cheapest (then the costliest part again, up to ``num_parts``), so each part holds
    sequences of similar length: its attention pads each context to the part's
    longest (see :func:`row_cost`), and short and long contexts do not share a pad.

    Args:
        counts: new tokens per row.
        start_positions: position of each row's first new token.
        num_parts: most parts wanted.
        min_cost: least total work for each extra part (default ``MIN_SPLIT_COST``).

    Returns:
        Row indices per part, each in batch order (two or more non-empty parts), or
        None when the step is too small or has a single row.
    """
    lens = [s + c for c, s in zip(counts, start_positions)]
    least = MIN_SPLIT_COST if min_cost is None else max(1, min_cost)
    total = sum(row_cost(c, n) for c, n in zip(counts, lens))
    parts = min(num_parts, len(counts), total // least + 1)
    if parts < 2:
        return None
    order = sorted(range(len(counts)), key=lens.__getitem__)
    tokens = [0, *itertools.accumulate(counts[row] for row in order)]

    def cost(lo: int, hi: int) -> int:  # rows order[lo:hi], padded to the longest
        return (TOKEN_COST + lens[order[hi - 1]]) * (tokens[hi] - tokens[lo])

    segments = [(0, len(order))]
    while len(segments) < parts:
        lo, hi = max(segments, key=lambda seg: cost(*seg) if seg[1] - seg[0] > 1 else -1)
        if hi - lo < 2:
            break
        cut = min(range(lo + 1, hi), key=lambda k: max(cost(lo, k), cost(k, hi)))
        at = segments.index((lo, hi))
        segments[at : at + 1] = [(lo, cut), (cut, hi)]
    return [sorted(order[lo:hi]) for lo, hi in segments]


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
    return merged.index_select(0, int64_tensor(rank).to(merged.device))


@dataclass(frozen=True)
class StepPart:
    """The rows of a step that one forward runs, with their inputs.

    Attributes:
        rows: indices into the batch, in batch order.
        token_ids, start_positions, block_tables: those rows' entries of the batch.
        keep: ``[k]`` int64, packed-token index of each sampled row's last new token
            (the first row's last token when no row is sampled: one unused row of logits).
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


class StartLatch:
    """Counts a step's parts down as they enter their forward; :meth:`wait` returns
    once all have (or at the timeout), so the waiting thread wakes once per step."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._left = 0

    def reset(self, count: int) -> None:
        """Expect ``count`` arrivals (before the parts start)."""
        with self._condition:
            self._left = count

    def arrive(self) -> None:
        """One part is about to enter its forward."""
        with self._condition:
            self._left -= 1
            if self._left <= 0:
                self._condition.notify_all()

    def wait(self, timeout: float) -> bool:
        """Block (GIL released) until every expected part arrived; False on timeout."""
        with self._condition:
            return self._condition.wait_for(lambda: self._left <= 0, timeout)
