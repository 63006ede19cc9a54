"""One request pipeline for the HTTP routes and the websocket: the body read (a 4xx for
every way it can be wrong), validated by its schema, its engine requests queued."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web

from aioserve.engine import AsyncEngine
from aioserve.engine.output import RequestStream
from aioserve.errors import EngineError
from aioserve.request_meta import RequestMeta
from aioserve.sampling_params import SamplingParams
from aioserve.server.errors import ApiError, api_error, bad_request, too_large
from aioserve.server.schema.requests import Body, RequestFieldError, Served, parse
from aioserve.server.state import ENGINE_KEY, MODEL_NAMES_KEY


async def read_body(request: web.Request) -> dict[str, Any]:
    """The HTTP body as a JSON object: ApiError 413 when too large, else as :func:`decode`."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, too_large(request.client_max_size),
                       code="request_too_large") from None
    return decode(raw)


def decode(raw: bytes | str, what: str = "the request body") -> dict[str, Any]:
    """A body (or websocket message: ``what`` names it in the refusals) as a JSON object:
    ApiError 400 ``invalid_json`` when it is empty, not JSON or not an object;
    ``invalid_encoding`` when not UTF-8 text."""
    if not raw:
        raise bad_request(f"{what} is empty; send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"{what} is not valid UTF-8 (byte {exc.start})", code="invalid_encoding"
        ) from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} "
            f"column {exc.colno}",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise bad_request(f"{what} nests too deeply", code="invalid_json") from None
    except ValueError as exc:  # e.g. an integer literal with more than 4300 digits
        raise bad_request(f"{what} is not acceptable JSON: {exc}",
                          code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(
            f"{what} must be a JSON object, got {type(body).__name__}",
            code="invalid_json",
        )
    check_text(body)
    return body


def validate(model: type[Body], body: dict[str, Any], app: web.Application) -> Body:
    """``body`` read as ``model``; RequestFieldError naming the first faulty field."""
    return parse(model, body, served(app))


def served(app: web.Application) -> Served:
    """What validation knows of the server: its model's names and context length."""
    core = app[ENGINE_KEY].core
    names = app[MODEL_NAMES_KEY]
    return Served(names[0], core.max_model_len if core is not None else None, names[1:])


def stop_after_header(value: str | None) -> int | None:
    """An ``X-Stop-After`` header (benchmarks' hidden stop, see ``AsyncEngine.add_request``)
    as an int; RequestFieldError (400) naming it when it is not an integer >= 1."""
    if value is None:
        return None
    if not (value.strip().isascii() and value.strip().isdigit()) or int(value) < 1:
        raise RequestFieldError("X-Stop-After", f"X-Stop-After must be an integer >= 1 (output "
                                f"tokens after which the request stops), got {value!r}")
    return int(value)


def start(
    engine: AsyncEngine, prompts: Sequence[str | list[int]], params: SamplingParams, n: int,
    call_id: str, meta: RequestMeta, request_id: str | None = None,
    stop_after: int | None = None,
) -> list[RequestStream]:
    """Queue one engine request per (prompt, sample), all or none: stream ``i`` is prompt
    ``i // n``, sample ``i % n`` (engine id ``{call_id}-{i}``, seed ``+ i % n``). ApiError
    (via :func:`~aioserve.server.errors.api_error`) when the engine refuses one."""
    streams: list[RequestStream] = []
    try:
        for index in range(len(prompts) * n):
            sample = index % n
            if sample and params.seed is not None:
                sample_params = replace(params, seed=params.seed + sample)
            else:
                sample_params = params
            streams.append(engine.add_request(prompts[index // n], sample_params,
                                              f"{call_id}-{index}", meta=meta,
                                              stop_after=stop_after))
    except BaseException as exc:
        for stream in streams:
            engine.release(stream)
        if isinstance(exc, (EngineError, ValueError)):
            raise api_error(exc, request_id) from None
        raise
    return streams


def is_text(value: Any) -> bool:
    """Whether every string of a JSON value, keys included, is valid Unicode (no recursion)."""
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
    """ApiError 400 ``invalid_encoding`` naming the field holding a lone surrogate."""
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
