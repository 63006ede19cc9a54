"""Every fault of a request mapped to its status and code once, for HTTP and the
websocket alike; the HTTP body is ``{"error": {"message", "type", "param", "code"}}``,
aiohttp's own errors (413, 404, 405) and unexpected exceptions (500) included."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from aioserve.errors import AdmissionError, EngineError, EngineNotRunningError, RequestShedError
from aioserve.server.schema.requests import RequestFieldError, field_of_message
from aioserve.server.schema.responses import Error, ErrorDetail

logger = logging.getLogger(__name__)

#: HTTP status -> OpenAI error ``type`` (else ``invalid_request_error`` or ``server_error``).
ERROR_TYPES: dict[int, str] = {404: "not_found_error", 429: "rate_limit_error",
                               503: "service_unavailable"}


class ApiError(Exception):
    """An error answered to the client: HTTP ``status``, a ``message`` naming the field at
    fault, that field as ``param``, a machine-readable ``code``, and response ``headers``
    (``Retry-After`` on a 429)."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def response(self) -> web.Response:
        body = error_body(self.status, self.message, param=self.param, code=self.code)
        return web.json_response(body, status=self.status, headers=self.headers)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object for ``status``."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return Error(error=ErrorDetail(message=message, type=kind, param=param,
                                   code=code)).model_dump()


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def too_large(limit: int) -> str:
    """The 413's message: the body limit in bytes and the flag that sets it."""
    return f"request body too large: the limit is {limit} bytes (see --max-body-bytes)"


def api_error(exc: Exception, request_id: str | None = None) -> ApiError:
    """The error answered for ``exc``, on HTTP and on the websocket.

    A refused field is a 400 naming it (404 ``model_not_found`` for another model); a
    ``ValueError`` from ``AsyncEngine.add_request`` a 400 naming the field its message
    starts with (``duplicate_request_id`` for ``request_id``, the call's id sent as
    ``request_id``); a request the admission limit refused a 429 ``queue_full`` or
    ``queue_timeout`` with ``Retry-After``; a request the engine could not finish a 503
    ``engine_not_running`` or ``request_shed`` (the client may retry), else a 500
    ``engine_error``.
    """
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestFieldError):
        status = 404 if exc.code == "model_not_found" else 400
        return ApiError(status, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, AdmissionError):
        return ApiError(429, str(exc), code=exc.reason,
                        headers={"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, EngineNotRunningError):
        return ApiError(503, str(exc), code="engine_not_running")
    if isinstance(exc, RequestShedError):
        return ApiError(503, str(exc), code="request_shed")
    if isinstance(exc, EngineError):
        return ApiError(500, str(exc), code="engine_error")
    param = field_of_message(str(exc), "prompt")
    if param == "request_id" and request_id is not None:
        return bad_request(f"request_id {request_id!r} (the request_id field or X-Request-Id "
                           "header) is in use by a request still running", param,
                           "duplicate_request_id")
    return bad_request(str(exc), param)


_HTTP_CODES: dict[int, str] = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
}


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Answer failures as JSON errors (a started websocket or SSE stream reports its own
    in-band), echoing the client's ``X-Request-Id``."""
    try:
        return await handler(request)
    except (ApiError, RequestFieldError, EngineError) as exc:
        response = api_error(exc).response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = too_large(request.client_max_size) if exc.status == 413 else exc.reason
        body = error_body(exc.status, message, code=_HTTP_CODES.get(exc.status))
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        response = web.json_response(body, status=exc.status, headers=headers)
    except (ConnectionError, TimeoutError):  # the client went away; nothing to answer
        raise
    except Exception:
        logger.exception("unhandled error in %s %s", request.method, request.path)
        response = web.json_response(
            error_body(500, "internal server error", code="internal_error"), status=500
        )
    if "X-Request-Id" in request.headers:
        response.headers["X-Request-Id"] = request.headers["X-Request-Id"]
    return response
