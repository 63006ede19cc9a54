"""The aiohttp application factory; the engine lives as long as the app."""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Middleware
from pydantic import BaseModel

from aioserve.config import EngineConfig
from aioserve.dashboard import live_page
from aioserve.engine import AsyncEngine
from aioserve.engine.step_log import StepLog
from aioserve.server import access, openapi, session
from aioserve.server.errors import ApiError, error_middleware
from aioserve.server.metrics import ServerMetrics
from aioserve.server.openai.chat import create_chat_completion
from aioserve.server.openai.completions import create_completion
from aioserve.server.pipeline import served
from aioserve.server.schema import responses as out
from aioserve.server.state import (
    CONFIG_KEY,
    ENGINE_KEY,
    MODEL_NAMES_KEY,
    ServerConfig,
    model_names,
    served_model_name,
)
from aioserve.server.tenant_labels import TenantLabels
from aioserve.server.ws import outbox, stats_feed, websocket

METRICS_KEY: web.AppKey[ServerMetrics] = web.AppKey("metrics", ServerMetrics)


def json_response(body: BaseModel, status: int = 200) -> web.Response:
    return web.json_response(body.model_dump(mode="json"), status=status)


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 while the engine runs and admits work, else 503."""
    engine = request.app[ENGINE_KEY]
    if engine.is_draining:
        return json_response(out.Health(status="shutting down"), 503)
    if engine.is_running:
        return json_response(out.Health(status="ok"))
    return json_response(out.Health(status="engine not running"), 503)


def _model_card(app: web.Application) -> out.Model:
    engine = app[ENGINE_KEY]
    core = engine.core
    return out.Model(
        id=served_model_name(app), object="model", created=int(app.get(_STARTED_KEY, time.time())),
        owned_by="aioserve", root=served_model_name(app),
        max_model_len=core.max_model_len if core is not None else None)


async def list_models(request: web.Request) -> web.Response:
    return json_response(out.ModelList(object="list", data=[_model_card(request.app)]))


async def retrieve_model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}``: the served model; 404 ``model_not_found`` otherwise."""
    name = request.match_info["model"]
    if not served(request.app).accepts(name):
        raise ApiError(404, f"model {name!r} does not exist; this server serves "
                       f"{served_model_name(request.app)!r}", param="model",
                       code="model_not_found")
    return json_response(_model_card(request.app))


_STARTED_KEY: web.AppKey[float] = web.AppKey("started", float)


async def dashboard(request: web.Request) -> web.Response:
    title = f"aioserve · {served_model_name(request.app)}"
    return web.Response(text=live_page(title), content_type="text/html")


def create_app(
    engine: AsyncEngine | EngineConfig, config: ServerConfig | None = None
) -> web.Application:
    """An aiohttp app serving ``engine``; the engine starts and stops with the app.

    Args:
        engine: an engine (not started) or a config to build one from.
        config: server settings (names, chat template, limits); default ``ServerConfig()``.

    Run it with ``handler_cancellation=True`` (as ``aioserve serve`` does) so a
    disconnect cancels its handler at once; without it handlers still notice within
    50 ms.
    """
    if isinstance(engine, EngineConfig):
        engine = AsyncEngine(engine)
    config = config or ServerConfig()
    middlewares: list[Middleware] = [error_middleware]
    if config.api_key is not None:
        middlewares.append(access.api_key_middleware(config.api_key, config.metrics_public))
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=middlewares)
    app[ENGINE_KEY] = engine
    app[CONFIG_KEY] = config
    app[_STARTED_KEY] = time.time()
    # the one rule for tenant labels: every tenant-keyed series reads metrics.tenant_labels
    metrics = ServerMetrics(engine, TenantLabels(pseudonymous=config.metrics_open))
    app[METRICS_KEY] = metrics
    app[outbox.SOCKETS_KEY] = weakref.WeakSet()
    app[MODEL_NAMES_KEY] = model_names(config, engine)
    feed = stats_feed.StatsFeed(engine, app[MODEL_NAMES_KEY][0],
                                interval=config.stats_interval)
    app[stats_feed.STATS_FEED_KEY] = feed
    app[outbox.OUTBOXES_KEY] = weakref.WeakSet()

    async def engine_lifetime(app: web.Application) -> AsyncIterator[None]:
        await engine.start()
        metrics.attach()
        feed.attach()
        steps = StepLog(engine, config.step_log) if config.step_log else None
        if steps is not None:
            steps.attach()
        yield
        feed.detach()
        metrics.detach()
        await engine.shutdown()
        if steps is not None:
            steps.detach()

    app.cleanup_ctx.append(engine_lifetime)
    app.on_shutdown.append(outbox.close_all)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)
    app.router.add_post("/v1/completions", create_completion)
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_get("/metrics", metrics.handle)
    app.router.add_get("/openapi.json", openapi.handle)
    app.router.add_get("/ws", websocket.handle)
    app.router.add_get("/ws/stats", stats_feed.handle)
    app.router.add_get("/", dashboard)
    app.router.add_get("/dashboard", dashboard)
    app.router.add_post("/dashboard/login", session.login)
    app.router.add_post("/dashboard/logout", session.logout)
    app.router.add_get("/dashboard/session", session.session)
    if config.allowed_origins:
        access.enable_cors(app, config.allowed_origins)
    return app
