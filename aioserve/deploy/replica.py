"""The Ray Serve replica: one :class:`AsyncEngine` behind ``aioserve serve``'s own aiohttp app on
loopback, so every request is handled by the same code (errors, SSE, disconnects); closing the
loopback connection aborts the engine requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from ray import serve

from aioserve.config import EngineConfig
from aioserve.deploy.coalesce import coalesced
from aioserve.deploy.forwarded import RETURNED_HEADERS, ForwardedRequest, ResponseHead
from aioserve.deploy.replica_metrics import ReplicaMetrics
from aioserve.server import METRICS_KEY, ServerConfig, create_app
from aioserve.server.metrics import PREFIX
from aioserve.server.state import ENGINE_KEY


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
        self, request: ForwardedRequest, prefix_key: str = ""
    ) -> AsyncIterator[ResponseHead | bytes]:
        """A :class:`ResponseHead`, then body chunks (``prefix_key`` is for the router only)."""
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

    async def stats(self, prefix_key: str = "") -> dict[str, Any]:
        """:meth:`AsyncEngine.stats` plus ``replica`` and ``num_aborted`` (``prefix_key`` lets a
        caller aim at one replica)."""
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
