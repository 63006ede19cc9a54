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
    check_text(body)
    return body


def is_text(value: Any) -> bool:
    """True when every string in a JSON value (keys included) is valid Unicode text (no
    lone surrogate). Walks without recursion: a body may nest as deep as the JSON reader
    allows."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def check_text(body: dict[str, Any]) -> None:
    """Refuse a JSON object holding a lone surrogate (``"\\ud800"`` escapes are valid
    JSON but not Unicode text: no tokenizer can encode them).

    Raises:
        ApiError: 400 naming the top-level field that holds one.
    """
    try:  # the fast path: one C pass
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        return
    except (UnicodeEncodeError, RecursionError):
        pass
    for name, value in body.items():
        if not is_text(name) or not is_text(value):
            field = name if is_text(name) else None
            raise bad_request(
                f"{field or 'a field name'} contains a lone surrogate (a \\ud800-\\udfff "
                "escape that is not part of a pair), which is not valid Unicode text",
                field, code="invalid_encoding",
            )
