"""Routers by load alone: round robin, least outstanding, power of two choices."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from aioserve.routing.router import ReplicaLoad, RouteRequest

#: What "load" counts: outstanding requests or outstanding tokens.
LoadMeasure = Literal["requests", "tokens"]


def load_of(load: ReplicaLoad, by: LoadMeasure) -> int:
    """A replica's outstanding requests or tokens."""
    return load.outstanding_requests if by == "requests" else load.outstanding_tokens


class RoundRobin:
    """Replica 0, 1, ..., n-1, 0, ... whatever their load (Vidur's round robin)."""

    name = "round_robin"

    def __init__(self) -> None:
        self.next = 0

    def choose(self, request: RouteRequest, loads: Sequence[ReplicaLoad]) -> int:
        index = self.next % len(loads)
        self.next = index + 1
        return index


class LeastOutstanding:
    """The replica with the fewest outstanding requests (or tokens); ties to the lowest index.

    Args:
        by: ``"requests"`` or ``"tokens"``."""

    name = "least_outstanding"

    def __init__(self, by: LoadMeasure = "requests") -> None:
        self.by: LoadMeasure = by

    def choose(self, request: RouteRequest, loads: Sequence[ReplicaLoad]) -> int:
        return min(range(len(loads)), key=lambda i: load_of(loads[i], self.by))


class PowerOfTwo:
    """Power of two choices (Mitzenmacher, 2001): two distinct replicas drawn at random,
    the less loaded one taken (a tie: the first drawn).

    Args:
        seed: seed of the draws (the same seed, the same choices).
        by: ``"requests"`` or ``"tokens"``."""

    name = "pow2"

    def __init__(self, seed: int = 0, by: LoadMeasure = "requests") -> None:
        self.rng = random.Random(seed)
        self.by: LoadMeasure = by

    def choose(self, request: RouteRequest, loads: Sequence[ReplicaLoad]) -> int:
        if len(loads) == 1:
            return 0
        first, second = self.rng.sample(range(len(loads)), 2)
        return second if load_of(loads[second], self.by) < load_of(loads[first], self.by) else first
