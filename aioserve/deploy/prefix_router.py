"""A Ray Serve router sending requests sharing a prompt prefix to one replica unless it is busy."""

from __future__ import annotations

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica

from aioserve.deploy.affinity import affinity_order


class PrefixAffinityRouter(PowerOfTwoChoicesRequestRouter):
    """Prefix affinity with a load fallback (pass as ``request_router_class``)."""

    def initialize_state(  # type: ignore[override]  # Serve passes request_router_kwargs
        self, imbalanced_threshold: int = 8,
    ) -> None:
        self.imbalanced_threshold = imbalanced_threshold

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The preferred replica first, then the others; power of two choices otherwise."""
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
        """Whether the preferred replica exceeds the least loaded by ``imbalanced_threshold``."""
        lengths = await self._queue_lengths(replicas)
        mine = lengths.get(preferred.replica_id.unique_id)
        if mine is None:
            return False
        return mine - min(lengths.values()) > self.imbalanced_threshold

    async def _queue_lengths(self, replicas: list[RunningReplica]) -> dict[str, int]:
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
