"""A Ray Serve request router that asks an aioserve router (``aioserve.routing``)."""

from __future__ import annotations

import sys
import types
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from aioserve.routing.registry import load_router
from aioserve.routing.router import ReplicaLoad, RouteRequest

#: The ``sys.modules`` entry holding :func:`router_views`'s dict.
_VIEWS_HOLDER = "aioserve.deploy._router_views"


def router_views() -> dict[str, int]:
    """Replicas each router of this process sees now, by its ``view`` name (the ingress's
    ``/health`` reads it: ready means its router sees every target replica). One dict per
    process, kept in ``sys.modules``: Serve ships the router and ingress classes by value,
    each with its own copy of this module's globals."""
    holder = sys.modules.get(_VIEWS_HOLDER)
    if holder is None:
        holder = sys.modules.setdefault(_VIEWS_HOLDER, types.ModuleType(_VIEWS_HOLDER))
    views: dict[str, int] = holder.__dict__.setdefault("views", {})
    return views


class ContractRouter(RequestRouter):
    """Serve's request router over any aioserve router (pass as ``request_router_class``).

    The replicas, ordered by id, are the router's indices (when a replica leaves, the
    indices after it shift: the prefix router's record then points one off until it
    relearns). Their loads are what this router chose and Serve has not reported completed
    (requests, prompt + ``max_tokens``), as the cluster simulator counts them (a choice
    Serve overrides, when the chosen replica is full, stays counted on it until it ends);
    free KV blocks are not known here (0). A call with a ``route`` keyword (a
    :class:`RouteRequest`) is routed by the router, one with ``replica`` (an id) goes to
    that replica, any other to the least loaded; the others follow by load.
    ``self.sent``: request -> (replica it was counted on, its tokens)."""

    def initialize_state(  # type: ignore[override]  # Serve passes request_router_kwargs
        self, router: str = "pow2", router_params: dict[str, Any] | None = None,
        kv_blocks: int = 0, view: str = "",
    ) -> None:
        self.view = view
        self.router = load_router(router, router_params)
        self.kv_blocks = kv_blocks
        self.requests: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.sent: dict[str, tuple[str, int]] = {}

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Serve's hook: the replicas to route to changed; their count goes to
        :func:`router_views` under ``view``."""
        super().update_replicas(replicas)
        if self.view:
            router_views()[self.view] = len(replicas)

    def _load(self, replica: RunningReplica) -> ReplicaLoad:
        rid = replica.replica_id.unique_id
        return ReplicaLoad(self.requests.get(rid, 0), self.tokens.get(rid, 0), 0,
                           self.kv_blocks)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The router's choice first, then the rest by load; the choice counts as sent."""
        replicas = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        if pending_request is None or not replicas:
            return [replicas]
        key = pending_request.metadata.internal_request_id
        self._undo(key)  # a request routed again (a backoff) counts once
        loads = [self._load(r) for r in replicas]
        order = sorted(range(len(replicas)), key=lambda i: loads[i].outstanding_requests)
        route, pinned = pending_request.kwargs.get("route"), pending_request.kwargs.get("replica")
        first: int | None = None
        if isinstance(route, RouteRequest):
            first = self.router.choose(route, loads)
        elif pinned:
            first = next((i for i, r in enumerate(replicas)
                          if r.replica_id.unique_id == pinned), None)
        if first is not None:
            order.remove(first)
            order.insert(0, first)
        weight = route.num_prompt_tokens + route.max_tokens if isinstance(
            route, RouteRequest) else 0
        self._count(key, replicas[order[0]].replica_id.unique_id, weight)
        return [[replicas[i]] for i in order]

    def _count(self, key: str, replica: str, weight: int) -> None:
        self.sent[key] = (replica, weight)
        self.requests[replica] = self.requests.get(replica, 0) + 1
        self.tokens[replica] = self.tokens.get(replica, 0) + weight

    def _undo(self, key: str) -> None:
        replica, weight = self.sent.pop(key, ("", 0))
        if replica:
            self.requests[replica] -= 1
            self.tokens[replica] -= weight

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        """Serve's hook: the request ended (done, failed or cancelled)."""
        self._undo(internal_request_id)
