"""Prefix-cache affinity on prompt token blocks, with a load bound."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from aioserve.routing.balance import LoadMeasure, load_of
from aioserve.routing.router import ReplicaLoad, RouteRequest


class PrefixAffinity:
    """Send a prompt where its leading blocks were sent before, within a load bound; llm-d's
    filter -> score -> pick with weighted scorers.

    Filter: a replica is eligible while its load with this request stays at most
    ``(1 + load_bound)`` x the mean load with it (rounded up when counting requests):
    consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA'18), so
    one hot prompt cannot pin every request to one replica. Unlike the paper, the bound is
    never below the mean plus ``load_slack`` requests (of this request's weight, counting
    tokens), so that at light load a prompt keeps its home instead of spreading.

    Score: ``prefix_weight`` x the fraction of the prompt's blocks found, leading blocks
    first, in the replica's index, plus ``load_weight`` x ``(max - load) / (max - min)``
    over the eligible (llm-d's prefix-cache and queue scorers; 3 and 2 are its default
    weights). Pick: the best score; ties by a rendezvous hash of the first block, so a new
    prompt has one home.

    The index is this router's record of the blocks it sent to each replica, least recently
    sent dropped past ``capacity_blocks`` (llm-d's approximate prefix scorer); it estimates
    the replica's cache, which may have evicted blocks it still lists.

    Args:
        load_bound: epsilon of the bound (>= 0; 0: at most the mean).
        load_slack: the least room over the mean, in requests (>= 0).
        by: load as ``"requests"`` or ``"tokens"`` (prompt + ``max_tokens`` of the request).
        prefix_weight, load_weight: the scorers' weights (>= 0).
        capacity_blocks: blocks indexed per replica; None: the replica's KV blocks."""

    name = "prefix"

    def __init__(self, load_bound: float = 0.25, load_slack: float = 2.0,
                 by: LoadMeasure = "requests",
                 prefix_weight: float = 3.0, load_weight: float = 2.0,
                 capacity_blocks: int | None = None) -> None:
        if min(load_bound, load_slack, prefix_weight, load_weight) < 0:
            raise ValueError("load_bound, load_slack, prefix_weight and load_weight must be >= 0")
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.load_bound = load_bound
        self.load_slack = load_slack
        self.by: LoadMeasure = by
        self.prefix_weight = prefix_weight
        self.load_weight = load_weight
        self.capacity_blocks = capacity_blocks
        self.index: list[OrderedDict[int, None]] = []

    def eligible(self, request: RouteRequest, loads: Sequence[ReplicaLoad]) -> list[int]:
        """The replicas within the load bound (never none: the least loaded always is)."""
        weight = 1 if self.by == "requests" else request.num_prompt_tokens + request.max_tokens
        values = [load_of(load, self.by) for load in loads]
        mean = (sum(values) + weight) / len(values)
        bound = max((1 + self.load_bound) * mean, mean + self.load_slack * weight)
        if self.by == "requests":
            bound = math.ceil(bound - 1e-9)
        found = [i for i, value in enumerate(values) if value + weight <= bound]
        least = min(values)
        return found or [i for i, value in enumerate(values) if value == least]

    def matched(self, replica: int, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` the replica's index holds."""
        index = self.index[replica]
        count = 0
        for block in hashes:
            if block not in index:
                break
            count += 1
        return count

    def choose(self, request: RouteRequest, loads: Sequence[ReplicaLoad]) -> int:
        while len(self.index) < len(loads):
            self.index.append(OrderedDict())
        hashes = request.block_hashes
        candidates = self.eligible(request, loads)
        values = {i: load_of(loads[i], self.by) for i in candidates}
        high, low = max(values.values()), min(values.values())
        first = hashes[0] if hashes else 0

        def score(i: int) -> tuple[float, int]:
            fit = self.matched(i, hashes) / len(hashes) if hashes else 0.0
            room = (high - values[i]) / (high - low) if high > low else 1.0
            return self.prefix_weight * fit + self.load_weight * room, hash((first, i))

        choice = max(candidates, key=score)
        self._record(choice, hashes, loads[choice])
        return choice

    def _record(self, replica: int, hashes: Sequence[int], load: ReplicaLoad) -> None:
        index = self.index[replica]
        for block in reversed(hashes):  # leading blocks newest: tails go first, as in vLLM
            index[block] = None
            index.move_to_end(block)
        capacity = self.capacity_blocks or load.kv_blocks
        while capacity and len(index) > capacity:
            index.popitem(last=False)
