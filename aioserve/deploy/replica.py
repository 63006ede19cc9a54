"""The Ray Serve replica: one :class:`AsyncEngine` behind ``aioserve serve``'s app on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from ray import serve
from ray.util.metrics import Gauge

from aioserve.config import EngineConfig
from aioserve.deploy.coalesce import coalesced
from aioserve.deploy.forwarded import RETURNED_HEADERS, ForwardedRequest, ResponseHead
from aioserve.server import METRICS_KEY, ServerConfig, create_app
from aioserve.server.metrics import PREFIX
from aioserve.server.state import ENGINE_KEY

#: Engine stat -> (metric name, description).
EXPORTED: dict[str, tuple[str, str]] = {
    "num_running": ("aioserve_num_requests_running", "requests running in the engine"),
    "num_waiting": ("aioserve_num_requests_waiting", "requests waiting for a slot"),
    "kv_cache_usage": ("aioserve_kv_cache_usage", "fraction of KV blocks in use (0-1)"),
    "num_free_blocks": ("aioserve_kv_free_blocks", "free KV-cache blocks"),
    "num_preemptions": ("aioserve_num_preemptions", "preemptions since start"),
    "num_steps": ("aioserve_num_steps", "engine steps since start"),
}


class ReplicaMetrics:
    """One replica's engine stats as Ray gauges tagged ``replica=<id>``."""

    def __init__(self, replica: str) -> None:
        self.tags = {"replica": replica}
        self.gauges = {
            stat: Gauge(name, description, tag_keys=("replica",))
            for stat, (name, description) in EXPORTED.items()
        }

    def record(self, stats: Mapping[str, float]) -> None:
        """Set every gauge from :meth:`AsyncEngine.stats`."""
        for stat, gauge in self.gauges.items():
            gauge.set(float(stats[stat]), tags=self.tags)


class EngineReplica:
    """One engine per Serve replica (decorate with ``serve.deployment``; see :func:`build_app`)."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async __init__
        self, engine_config: EngineConfig, server_config: ServerConfig,
        stream_interval: float = 0.02, metrics_period: float = 1.0,
    ) -> None:
        self.app = create_app(engine_config, server_config)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._runner = web.AppRunner(self.app, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()  # loads the model: the replica is ready after this
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self._url = f"http://{host}:{port}"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        self._metrics = ReplicaMetrics(self.replica_id)
        self._metrics_period = metrics_period
        self._stream_interval = stream_interval
        self._metrics_task = asyncio.create_task(self._export_metrics())

    async def check_health(self) -> None:
        """Serve's health check; raises RuntimeError when the engine is not running."""
        if not self.app[ENGINE_KEY].is_running:
            raise RuntimeError("the engine is not running")

    async def forward(
        self, request: ForwardedRequest, route: Any = None, replica: str = ""
    ) -> AsyncIterator[ResponseHead | bytes]:
        """A :class:`ResponseHead`, then body chunks (``route`` and ``replica`` are for the
        router only: :class:`aioserve.deploy.contract_router.ContractRouter`)."""
        async with self._session.request(
            request.method, self._url + request.path, data=request.body,
            headers=request.headers, allow_redirects=False,
        ) as response:
            headers = {
                name: response.headers[name]
                for name in RETURNED_HEADERS if name in response.headers
            }
            yield ResponseHead(response.status, headers, self.replica_id)
            async for chunk in coalesced(response.content, self._stream_interval):
                yield chunk

    async def stats(self, replica: str = "") -> dict[str, Any]:
        """:meth:`AsyncEngine.stats` plus ``replica`` and ``num_aborted`` (``replica``: the
        id to route the call to, for the router)."""
        registry = self.app[METRICS_KEY].registry
        aborted = registry.get_sample_value(
            f"{PREFIX}request_success_total", {"finished_reason": "abort"}
        )
        return {**self.app[ENGINE_KEY].stats(), "replica": self.replica_id,
                "num_aborted": int(aborted or 0)}

    async def _export_metrics(self) -> None:
        while True:
            engine = self.app[ENGINE_KEY]
            if engine.is_running:
                self._metrics.record(engine.stats())
            await asyncio.sleep(self._metrics_period)

    async def __del__(self) -> None:
        """Serve's shutdown hook."""
        self._metrics_task.cancel()
        await self._session.close()
        await self._runner.cleanup()
