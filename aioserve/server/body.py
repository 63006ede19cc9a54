"""Reading a JSON request body, with a 4xx for every way it can be wrong."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from aioserve.server.errors import ApiError, bad_request


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object.

    Raises:
        ApiError: 413 when the body exceeds the app's ``client_max_size``; 400 when it
            is empty, not UTF-8, not JSON, or not a JSON object.
    """
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(
            413,
            f"request body too large: the limit is {request.client_max_size} bytes "
            "(see --max-body-bytes)",
            code="request_too_large",
        ) from None
    if not raw:
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"the request body is not valid UTF-8 (byte {exc.start})", code="invalid_encoding"
        ) from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} "
            f"column {exc.colno}",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise bad_request("the request body nests too deeply", code="invalid_json") from None
    except ValueError as exc:  # e.g. an integer literal with more than 4300 digits
        raise bad_request(f"the request body is not acceptable JSON: {exc}",
                          code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(
            f"the request body must be a JSON object, got {type(body).__name__}",
            code="invalid_json",
        )
    return body
