"""The dashboard's session: the key typed once into the page's form becomes an HttpOnly,
SameSite=Strict cookie, so it never appears in a URL, a log line or the page's script.

The cookie holds ``HMAC-SHA256(key, "aioserve dashboard session")``, not the key: it opens
the dashboard's data (``/ws/stats``, ``/metrics``, ``/dashboard/session``) and nothing else
(``/v1/*`` still needs the key itself), and it changes when the key does.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from aiohttp import web

from aioserve.server.errors import ApiError
from aioserve.server.state import CONFIG_KEY

#: The cookie's name.
COOKIE = "aioserve_session"
#: Seconds a browser keeps the cookie.
COOKIE_MAX_AGE = 7 * 24 * 3600
_PURPOSE = b"aioserve dashboard session"


def session_token(api_key: str) -> str:
    """The cookie value that stands for ``api_key`` on the dashboard's data routes."""
    return hmac.new(api_key.encode(), _PURPOSE, hashlib.sha256).hexdigest()


async def _presented_key(request: web.Request) -> str | None:
    """``api_key`` of a JSON or form body; None when absent or malformed."""
    if request.content_type == "application/json":
        try:
            body = json.loads(await request.text())
        except (ValueError, UnicodeDecodeError):
            return None
        key = body.get("api_key") if isinstance(body, dict) else None
    else:
        key = (await request.post()).get("api_key")
    return key if isinstance(key, str) else None


async def login(request: web.Request) -> web.Response:
    """``POST /dashboard/login`` with ``{"api_key": KEY}`` (JSON or a form): 204 and the
    session cookie when it is the key; 401 ``invalid_api_key`` otherwise; 400 naming
    ``api_key`` when the field is missing. A server without a key answers 204 alone."""
    api_key = request.app[CONFIG_KEY].api_key
    if api_key is None:
        return web.Response(status=204)
    key = await _presented_key(request)
    if key is None:
        raise ApiError(400, "api_key: send the API key as {\"api_key\": \"...\"}",
                       param="api_key", code="missing_field")
    if not hmac.compare_digest(key.encode(), api_key.encode()):
        raise ApiError(401, "incorrect API key provided", param="api_key",
                       code="invalid_api_key")
    response = web.Response(status=204)
    response.set_cookie(COOKIE, session_token(api_key), max_age=COOKIE_MAX_AGE, path="/",
                        httponly=True, samesite="Strict", secure=request.secure)
    return response


async def logout(request: web.Request) -> web.Response:
    """``POST /dashboard/logout``: 204, the session cookie removed."""
    response = web.Response(status=204)
    response.del_cookie(COOKIE, path="/")
    return response


async def session(request: web.Request) -> web.Response:
    """``GET /dashboard/session``: 200 when the page may read the data (the key's
    middleware answered 401 otherwise); the page asks before it opens ``/ws/stats``,
    because a browser's websocket cannot see a refusal's status."""
    return web.json_response({"authenticated": True,
                              "key_required": request.app[CONFIG_KEY].api_key is not None})
