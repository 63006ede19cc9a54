"""The aiohttp application factory; the engine lives as long as the app."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from aioserve.config import EngineConfig
from aioserve.engine import AsyncEngine
from aioserve.server import websocket

ENGINE_KEY: web.AppKey[AsyncEngine] = web.AppKey("engine", AsyncEngine)


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 while the engine runs, else 503."""
    engine = request.app[ENGINE_KEY]
    if engine.is_running:
        return web.json_response({"status": "ok"})
    return web.json_response({"status": "engine not running"}, status=503)


def create_app(engine: AsyncEngine | EngineConfig, *, client_max_size: int = 1024**2) -> web.Application:
    """An aiohttp app serving ``engine``; the engine starts and stops with the app.

    Args:
        engine: an engine (not started) or a config to build one from.
        client_max_size: largest accepted request body in bytes (larger: 413).
    """
    if isinstance(engine, EngineConfig):
        engine = AsyncEngine(engine)
    app = web.Application(client_max_size=client_max_size)
    app[ENGINE_KEY] = engine

    async def engine_lifetime(app: web.Application) -> AsyncIterator[None]:
        await app[ENGINE_KEY].start()
        yield
        await app[ENGINE_KEY].shutdown()

    app.cleanup_ctx.append(engine_lifetime)
    app.on_shutdown.append(websocket.close_all)
    app.router.add_get("/health", health)
    app.router.add_get("/ws", websocket.handle)
    return app
