"""Who may call the server: an API key for every route that serves or reveals requests or
tenants, and CORS for browser clients.

With a key set, ``/v1/*``, the websockets (``/ws``, ``/ws/stats``), ``/metrics`` (unless
``metrics_public``) and ``/dashboard/session`` need it. A client presents it as
``Authorization: Bearer <key>``; the dashboard, which cannot set headers on a websocket,
presents the session cookie its login form got (:mod:`aioserve.server.session`), accepted
on the dashboard's data routes alone and only from the server's own origin. ``?api_key=``
on a websocket URL is still accepted for older clients (discouraged: URLs end up in logs).
``/health``, ``/openapi.json`` and the page itself stay open; they show no request, tenant
or filesystem path.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlsplit

import aiohttp_cors
from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from aioserve.server.errors import error_body
from aioserve.server.session import COOKIE, session_token

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Path prefixes that need the key.
PROTECTED = ("/v1/", "/ws", "/metrics", "/dashboard/session")
#: Paths on which the dashboard's session cookie stands for the key.
COOKIE_PATHS = ("/ws/stats", "/metrics", "/dashboard/session")


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if request.path.startswith("/ws"):
        return request.query.get("api_key")
    return None


def same_origin(request: web.Request) -> bool:
    """Whether the request's ``Origin`` (when a browser sent one) is this server's own."""
    origin = request.headers.get(hdrs.ORIGIN)
    return origin is None or urlsplit(origin).netloc == request.host


def is_protected(path: str, metrics_public: bool = False) -> bool:
    """Whether ``path`` needs the key (``metrics_public``: ``/metrics`` does not)."""
    if metrics_public and path == "/metrics":
        return False
    return path.startswith(PROTECTED)


def api_key_middleware(api_key: str, metrics_public: bool = False) -> Middleware:
    """A middleware answering 401 (``invalid_api_key``) to protected requests without
    ``api_key`` or the dashboard session made from it."""
    if not api_key:
        raise ValueError("api_key must not be empty")
    expected = api_key.encode()
    token = session_token(api_key).encode()

    @web.middleware
    async def check_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == hdrs.METH_OPTIONS or not is_protected(request.path,
                                                                   metrics_public):
            return await handler(request)
        key = _bearer(request)
        if key is not None and hmac.compare_digest(key.encode(), expected):
            return await handler(request)
        cookie = request.cookies.get(COOKIE)
        if (key is None and cookie is not None and request.path in COOKIE_PATHS
                and same_origin(request) and hmac.compare_digest(cookie.encode(), token)):
            return await handler(request)
        message = ("missing API key: send 'Authorization: Bearer <key>'" if key is None
                   and cookie is None else "incorrect API key provided")
        body = error_body(401, message, code="invalid_api_key")
        return web.json_response(body, status=401, headers={"WWW-Authenticate": "Bearer"})

    return check_api_key


def enable_cors(app: web.Application, origins: Sequence[str]) -> None:
    """Allow browser calls from ``origins`` (``"*"``: any) on every route added so far:
    preflights are answered and responses carry the CORS headers."""
    options = aiohttp_cors.ResourceOptions(  # type: ignore[no-untyped-call]
        allow_credentials=False, expose_headers="*", allow_headers="*", allow_methods="*",
        max_age=600)
    cors = aiohttp_cors.setup(app, defaults={origin: options for origin in origins})
    for route in list(app.router.routes()):
        cors.add(route)
