"""One OpenAI API call end to end: start its engine requests, then answer with one JSON
response or a Server-Sent Events stream. The endpoints differ only in their
:class:`ResponseFormat`."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from aioserve.errors import EngineError, EngineNotRunningError, RequestShedError
from aioserve.outputs import RequestOutput
from aioserve.request_meta import RequestMeta
from aioserve.sampling_params import SamplingParams
from aioserve.server.choices import Choices, Prompt
from aioserve.server.errors import ApiError, bad_request, error_body
from aioserve.server.openai.disconnect import DisconnectWatch
from aioserve.server.openai.sse import SSEStream
from aioserve.server.schema import CallOptions, RequestFieldError, Served, field_of_message
from aioserve.server.state import (
    CONFIG_KEY,
    ENGINE_KEY,
    MODEL_NAMES_KEY,
    model_names,
    served_model_name,
)


class ResponseFormat:
    """How one endpoint shapes its choices (subclassed per endpoint).

    Attributes:
        id_prefix: prefix of response ids (``cmpl``, ``chatcmpl``).
        object_name: ``object`` of a full response.
        chunk_object_name: ``object`` of a stream chunk.
    """

    id_prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def stream_start(self, index: int) -> dict[str, Any] | None:
        """A first chunk's choice for ``index`` (chat sends the role), or None."""
        return None

    def stream_choice(
        self, index: int, out: RequestOutput | None, finish_reason: str | None
    ) -> dict[str, Any]:
        """A chunk's choice: the delta ``out`` (None in the finish chunk)."""
        raise NotImplementedError

    def add(self, index: int, out: RequestOutput) -> None:
        """Accumulate a delta of choice ``index`` for the full response."""
        raise NotImplementedError

    def final_choice(self, index: int, finish_reason: str | None) -> dict[str, Any]:
        """Choice ``index`` of the full response, from what :meth:`add` accumulated."""
        raise NotImplementedError


def served(app: web.Application) -> Served:
    """What request validation needs of the server: the served name, the context."""
    core = app[ENGINE_KEY].core
    names = app.get(MODEL_NAMES_KEY) or model_names(app[CONFIG_KEY], app[ENGINE_KEY])
    return Served(names[0], core.max_model_len if core is not None else None, names[1:])


def refused(exc: RequestFieldError) -> ApiError:
    """The HTTP error for a refused field: 404 for an unknown model, else 400."""
    status = 404 if exc.code == "model_not_found" else 400
    return ApiError(status, str(exc), param=exc.param, code=exc.code)


def start_choices(
    request: web.Request, prompts: Sequence[Prompt], params: Sequence[SamplingParams],
    options: CallOptions, fmt: ResponseFormat, meta: RequestMeta | None = None,
) -> Choices:
    """Queue the call's engine requests.

    Raises:
        ApiError: 400 naming the field the engine rejected (empty prompt, context length,
            duplicate request id…); 503 when the engine is not running or a scheduling
            policy sheds the call.
    """
    call_id = f"{fmt.id_prefix}-{options.request_id or uuid.uuid4().hex}"
    try:
        return Choices(request.app[ENGINE_KEY], prompts, params, options.n, call_id, meta)
    except EngineError as exc:
        raise engine_error(exc) from None
    except ValueError as exc:
        message = str(exc)
        param = field_of_message(message, "prompt")
        if param != "request_id":
            raise bad_request(message, param, "invalid_value") from None
        # the engine's id is the call's (``cmpl-ID-0``): name the id the client sent
        message = (f"request_id {options.request_id!r} (the request_id field or X-Request-Id "
                   "header) is in use by a request still running")
        raise bad_request(message, param, "duplicate_request_id") from None


def engine_error(exc: EngineError) -> ApiError:
    """The HTTP error for a request the engine could not finish: 503
    ``engine_not_running``, 503 ``request_shed`` (a scheduling policy refused it; the
    client may retry later or elsewhere), else 500 ``engine_error``."""
    if isinstance(exc, EngineNotRunningError):
        return ApiError(503, str(exc), code="engine_not_running")
    if isinstance(exc, RequestShedError):
        return ApiError(503, str(exc), code="request_shed")
    return ApiError(500, str(exc), code="engine_error")


async def answer(
    request: web.Request, choices: Choices, options: CallOptions, fmt: ResponseFormat
) -> web.StreamResponse:
    """Answer the call from its running choices, with its request id in the
    ``X-Request-Id`` header; aborts them all when the client leaves, on error, and on
    the way out.

    Raises:
        ApiError: 500 (or 503) when the engine fails a non-streamed call.
    """
    head = {
        "id": f"{fmt.id_prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": served_model_name(request.app),
    }
    headers = {"X-Request-Id": options.request_id}
    try:
        async with DisconnectWatch(request):
            if options.stream:
                return await _stream(request, choices, options, fmt, head, headers)
            return await _collect(choices, fmt, head, headers)
    finally:
        choices.close()


def _usage(choices: Choices, completion_tokens: dict[int, int]) -> dict[str, Any]:
    return choices.usage(sum(completion_tokens.values()))


async def _collect(choices: Choices, fmt: ResponseFormat, head: dict[str, Any],
                   headers: dict[str, str]) -> web.Response:
    finish: dict[int, str | None] = {}
    tokens: dict[int, int] = {}
    try:
        async for index, out in choices:
            fmt.add(index, out)
            if out.finished:
                finish[index] = out.finish_reason
                tokens[index] = out.num_output_tokens
    except EngineError as exc:
        raise engine_error(exc) from None
    body = {
        **head,
        "object": fmt.object_name,
        "choices": [fmt.final_choice(i, finish.get(i)) for i in range(len(choices.streams))],
        "usage": _usage(choices, tokens),
    }
    return web.json_response(body, headers=headers)


async def _stream(
    request: web.Request, choices: Choices, options: CallOptions, fmt: ResponseFormat,
    head: dict[str, Any], headers: dict[str, str],
) -> web.StreamResponse:
    sse = SSEStream(request, headers)
    await sse.start()
    chunk = {**head, "object": fmt.chunk_object_name}
    tokens: dict[int, int] = {}
    try:
        for index in range(len(choices.streams)):
            first = fmt.stream_start(index)
            if first is not None:
                await sse.send({**chunk, "choices": [first]})
        async for index, out in choices:
            if out.token_ids or out.text:
                await sse.send({**chunk, "choices": [fmt.stream_choice(index, out, None)]})
            if out.finished:
                tokens[index] = out.num_output_tokens
                finish = fmt.stream_choice(index, None, out.finish_reason)
                await sse.send({**chunk, "choices": [finish]})
        if options.include_usage:
            await sse.send({**chunk, "choices": [], "usage": _usage(choices, tokens)})
        await sse.done()
    except EngineError as exc:
        error = engine_error(exc)
        with contextlib.suppress(ConnectionError):
            await sse.fail(error_body(error.status, error.message, code=error.code))
    except ConnectionError:
        pass  # the client went away; the caller aborts the requests
    return sse.response
