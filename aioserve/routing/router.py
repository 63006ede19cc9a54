"""The router contract: a request's prompt blocks and the replicas' loads in, an index out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from aioserve.block_keys import block_key
from aioserve.request_meta import DEFAULT_META, RequestMeta

__all__ = ["ReplicaLoad", "RouteRequest", "Router", "prompt_block_hashes"]


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as the router sees it when a request arrives.

    Attributes:
        outstanding_requests: requests sent to it and not ended (queued, waiting, running).
        outstanding_tokens: their prompt tokens plus their ``max_tokens``: the work they
            were sent with, which a front end counts without asking the replica.
        free_kv_blocks, kv_blocks: free and total KV blocks (free counts cached, unused blocks).
    """

    outstanding_requests: int = 0
    outstanding_tokens: int = 0
    free_kv_blocks: int = 0
    kv_blocks: int = 0


def prompt_block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """The chained hash of each full ``block_size``-token block of a prompt: the engine's
    prefix-cache keys (``aioserve.block_keys``), so equal hashes mean equal prefixes."""
    hashes: list[int] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_key(parent, token_ids[start:start + block_size])
        hashes.append(parent[0])
    return tuple(hashes)


@dataclass(frozen=True)
class RouteRequest:
    """What a router knows of a request (lengths in tokens).

    Attributes:
        block_hashes: :func:`prompt_block_hashes` of its prompt, first block first.
        block_size: tokens per block of those hashes."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    block_hashes: tuple[int, ...] = ()
    block_size: int = 16
    meta: RequestMeta = DEFAULT_META


@runtime_checkable
class Router(Protocol):
    """A router: ``choose`` is called once per request, in arrival order, with one load per
    replica (at least one), and returns the index of the replica that serves it. The
    decision is final, so a router may record it (the prefix router indexes the blocks it
    sent where). Routers are plain Python: the simulator and Ray Serve call the same ones.
    Build one with :func:`aioserve.routing.registry.load_router`."""

    name: str

    def choose(self, request: RouteRequest, loads: Sequence[ReplicaLoad]) -> int:
        """The replica for ``request``: an index into ``loads`` (one per replica, in the
        replicas' order; ``len(loads) >= 1``). Anything else is a ValueError at the caller
        (the simulator names the router); an exception propagates to it."""
        ...
