"""A Ray Serve request router that sends requests sharing a prompt prefix to the same
replica, where that prefix's KV blocks are most likely still cached, unless that replica
is busier than the rest, when it falls back to Serve's power of two choices. It builds
on Serve's ``PowerOfTwoChoicesRequestRouter`` (as Ray's own prefix router does) and its
queue-length probes.

The affinity is rendezvous (highest-random-weight) hashing of the request's
``prefix_key`` (the prompt's first characters, see :mod:`aioserve.deploy.affinity`)
over the live replicas: deterministic,
with no state to share between ingress replicas, and when a replica comes or goes only
the keys that mapped to it move. Ray's ``PrefixCacheAffinityRouter`` (``ray.serve.llm``)
keeps a prefix tree in an extra actor instead and reads the ``ray.llm`` request types;
this router needs neither.
"""

from __future__ import annotations

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica

from aioserve.deploy.affinity import affinity_order


class PrefixAffinityRouter(PowerOfTwoChoicesRequestRouter):
    """Prefix affinity with a load fallback (pass as ``request_router_class``).

    ``request_router_kwargs``:
        imbalanced_threshold: how many more ongoing requests than the least loaded
            replica the preferred replica may have before the request goes to power of
            two choices instead (default 8).
    """

    def initialize_state(  # type: ignore[override]  # Serve passes request_router_kwargs
        self, imbalanced_threshold: int = 8,
    ) -> None:
        """Store the router's settings (Serve calls this once)."""
        self.imbalanced_threshold = imbalanced_threshold

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The preferred replica for the request's prefix key as the first rank, then
        the other replicas in affinity order; power of two choices for requests without
        a key, or when the preferred replica is overloaded."""
        key = pending_request.kwargs.get("prefix_key", "") if pending_request else ""
        if not key or len(candidate_replicas) < 2:
            return await super().choose_replicas(candidate_replicas, pending_request)
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        ordered = [by_id[replica_id] for replica_id in affinity_order(key, list(by_id))]
        if await self._overloaded(ordered[0], candidate_replicas):
            return await super().choose_replicas(candidate_replicas, pending_request)
        return [[replica] for replica in ordered]

    async def _overloaded(
        self, preferred: RunningReplica, replicas: list[RunningReplica]
    ) -> bool:
        """True when the preferred replica has more than ``imbalanced_threshold`` more
        ongoing requests than the least loaded replica (lengths from Serve's cache when
        it keeps one, else probed, as power of two choices does)."""
        lengths = await self._queue_lengths(replicas)
        mine = lengths.get(preferred.replica_id.unique_id)
        if mine is None:
            return False
        return mine - min(lengths.values()) > self.imbalanced_threshold

    async def _queue_lengths(self, replicas: list[RunningReplica]) -> dict[str, int]:
        """Ongoing requests per replica id; replicas that do not answer are left out."""
        lengths: dict[str, int] = {}
        missing = []
        for replica in replicas:
            cached = (self.replica_queue_len_cache.get(replica.replica_id)
                      if self._use_replica_queue_len_cache else None)
            if cached is None:
                missing.append(replica)
            else:
                lengths[replica.replica_id.unique_id] = cached
        for replica, length in await self._probe_queue_lens(missing, 0):
            if length is not None:
                lengths[replica.replica_id.unique_id] = length
        return lengths
