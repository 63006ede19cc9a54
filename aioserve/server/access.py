"""Who may call the server: an API key (Bearer auth, or ``?api_key=`` on a websocket)
for ``/v1/*`` and the websockets, and CORS for browser clients."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence

import aiohttp_cors
from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from aioserve.server.errors import error_body

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Path prefixes that need the key.
PROTECTED = ("/v1/", "/ws")


def _presented_key(request: web.Request) -> str | None:
    header = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if request.path.startswith("/ws"):
        return request.query.get("api_key")
    return None


def api_key_middleware(api_key: str) -> Middleware:
    """A middleware answering 401 to protected requests without ``api_key``."""
    if not api_key:
        raise ValueError("api_key must not be empty")
    expected = api_key.encode()

    @web.middleware
    async def check_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == hdrs.METH_OPTIONS or not request.path.startswith(PROTECTED):
            return await handler(request)
        key = _presented_key(request)
        if key is not None and hmac.compare_digest(key.encode(), expected):
            return await handler(request)
        message = ("missing API key: send 'Authorization: Bearer <key>'" if key is None
                   else "incorrect API key provided")
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
