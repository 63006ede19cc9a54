"""The Ray Serve replica: one :class:`AsyncEngine` behind the very aiohttp app that
``aioserve serve`` runs, listening on the replica's own loopback.

Why a loopback app: every request is parsed, validated and answered by the same code as
``aioserve serve`` (the same 400 JSON errors, the same SSE chunks, the same disconnect
handling), with no second implementation to keep in step. The ingress forwards the raw
request; the replica replays it against its app on ``127.0.0.1`` and streams the answer
back as it comes: a :class:`ResponseHead`, then body chunks (bytes). When the caller
goes away Serve cancels the replica's generator, which closes the loopback connection,
which aborts the engine requests and frees their KV blocks, exactly as a client leaving
``aioserve serve`` does.
"""

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
    """One engine per Serve replica (decorate with ``serve.deployment`` to deploy; see
    :func:`aioserve.deploy.ray_serve.build_app`).

    Args:
        engine_config: the engine to load (the model loads in the replica's process).
        server_config: the app's settings (served model name, chat template, limits).
        stream_interval: seconds over which a streamed answer's chunks are merged into
            one Ray Serve stream item (0: one item per read; see
            :mod:`aioserve.deploy.coalesce`).
        metrics_period: seconds between exports of engine stats to Ray's metrics.
    """

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
        """Serve's health check.

        Raises:
            RuntimeError: the engine is not running (Serve then replaces the replica).
        """
        if not self.app[ENGINE_KEY].is_running:
            raise RuntimeError("the engine is not running")

    async def forward(
        self, request: ForwardedRequest, prefix_key: str = ""
    ) -> AsyncIterator[ResponseHead | bytes]:
        """Answer ``request`` with the app: a :class:`ResponseHead`, then body chunks.

        ``prefix_key`` is read by the prefix-affinity router only. Cancelling the
        generator (the client left) closes the loopback connection, which aborts the
        request's engine requests.
        """
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
        """The engine's :meth:`AsyncEngine.stats`, plus ``replica`` (the Serve replica
        id) and ``num_aborted`` (requests aborted since start, e.g. by disconnects).

        ``prefix_key`` is read by the prefix-affinity router only (a caller can aim at
        one replica with a key that maps to it).
        """
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
        """Serve's shutdown hook: stop exporting, close the session, stop the engine."""
        self._metrics_task.cancel()
        await self._session.close()
        await self._runner.cleanup()
