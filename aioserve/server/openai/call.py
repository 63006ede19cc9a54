"""One OpenAI call answered from its running engine requests: one JSON response or a
Server-Sent Events stream. The endpoints differ only in their :class:`ResponseFormat`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

from aiohttp import web

from aioserve.engine.output import RequestStream
from aioserve.errors import EngineError
from aioserve.outputs import RequestOutput
from aioserve.server.errors import api_error, error_body
from aioserve.server.schema import responses
from aioserve.server.schema.requests import CallFields
from aioserve.server.state import ENGINE_KEY, served_model_name

#: Seconds between checks that an HTTP client is still connected.
POLL_INTERVAL = 0.05


class DisconnectWatch:
    """``async with DisconnectWatch(request):`` cancels the handler (its body sees
    ``CancelledError``) within ``POLL_INTERVAL`` of its client's connection closing, so
    its requests are aborted even without aiohttp's ``handler_cancellation=True``."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DisconnectWatch:
        handler = asyncio.current_task()
        assert handler is not None
        self._task = asyncio.create_task(self._watch(handler))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self, handler: asyncio.Task[object]) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL)
            transport = self.request.transport
            if transport is None or transport.is_closing():
                handler.cancel()
                return


class SSEStream:
    """One Server-Sent Events response: ``data: {json}`` events ended by ``data: [DONE]``
    (or by an error event); a write raises ``ConnectionResetError`` once the client left."""

    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no", **headers})

    async def start(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, data: dict[str, Any]) -> None:
        await self.response.write(b"data: " + json.dumps(data).encode() + b"\n\n")

    async def done(self) -> None:
        await self.response.write(b"data: [DONE]\n\n")
        await self.response.write_eof()

    async def fail(self, error: dict[str, Any]) -> None:
        """An error event (the ``openai`` client raises ``APIError``), no ``[DONE]``."""
        await self.send(error)
        await self.response.write_eof()


class ResponseFormat:
    """How one endpoint shapes its choices: response ids' ``id_prefix``, the ``object``
    names, ``response_model`` (chunks are built as dicts: one per token)."""

    id_prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"
    response_model: type[responses.Completion | responses.ChatCompletion] = responses.Completion

    def stream_start(self, index: int) -> dict[str, Any] | None:
        """A first chunk's choice (chat sends the role), or None."""
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
        """Choice ``index`` of the full response."""
        raise NotImplementedError


def usage(streams: list[RequestStream], n: int, completion_tokens: int) -> responses.Usage:
    """The call's OpenAI ``usage`` (each prompt counted once, not per sample)."""
    prompt = sum(s.request.num_prompt_tokens for s in streams[::n])
    cached = sum(s.request.num_cached_tokens for s in streams[::n])
    return responses.Usage(prompt_tokens=prompt, completion_tokens=completion_tokens,
                           total_tokens=prompt + completion_tokens,
                           prompt_tokens_details=responses.CachedTokens(cached_tokens=cached))


async def outputs(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """``(choice index, output)`` of every stream until all finished; raises an EngineError."""
    if len(streams) == 1:
        while True:
            item = await streams[0].queue.get()
            if isinstance(item, BaseException):
                raise item
            yield 0, item
            if item.finished:
                return
    merged: asyncio.Queue[tuple[int, RequestOutput | BaseException]] = asyncio.Queue()

    async def forward(index: int, stream: RequestStream) -> None:
        while True:
            item = await stream.queue.get()
            merged.put_nowait((index, item))
            if isinstance(item, BaseException) or item.finished:
                return

    tasks = [asyncio.create_task(forward(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, item = await merged.get()
            if isinstance(item, BaseException):
                raise item
            remaining -= item.finished
            yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def answer(request: web.Request, streams: list[RequestStream], call: CallFields,
                 request_id: str, fmt: ResponseFormat) -> web.StreamResponse:
    """Answer the call as JSON or Server-Sent Events, ``X-Request-Id`` set; its requests
    are aborted when the client leaves, on error, and on the way out."""
    head = {"id": f"{fmt.id_prefix}-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": served_model_name(request.app)}
    headers = {"X-Request-Id": request_id}
    try:
        async with DisconnectWatch(request):
            if call.stream:
                return await _stream(request, streams, call, fmt, head, headers)
            return await _collect(streams, call.n or 1, fmt, head, headers)
    finally:
        for stream in streams:
            request.app[ENGINE_KEY].release(stream)


async def _collect(streams: list[RequestStream], n: int, fmt: ResponseFormat,
                   head: dict[str, Any], headers: dict[str, str]) -> web.Response:
    finish: dict[int, str | None] = {}
    tokens: dict[int, int] = {}
    try:
        async for index, out in outputs(streams):
            fmt.add(index, out)
            if out.finished:
                finish[index] = out.finish_reason
                tokens[index] = out.num_output_tokens
    except EngineError as exc:
        raise api_error(exc) from None
    body = fmt.response_model.model_validate({
        **head, "object": fmt.object_name,
        "choices": [fmt.final_choice(i, finish.get(i)) for i in range(len(streams))],
        "usage": usage(streams, n, sum(tokens.values())),
    })
    return web.json_response(body.model_dump(mode="json"), headers=headers)


async def _stream(
    request: web.Request, streams: list[RequestStream], call: CallFields,
    fmt: ResponseFormat, head: dict[str, Any], headers: dict[str, str],
) -> web.StreamResponse:
    sse = SSEStream(request, headers)
    await sse.start()
    chunk = {**head, "object": fmt.chunk_object_name}
    tokens: dict[int, int] = {}
    try:
        for index in range(len(streams)):
            first = fmt.stream_start(index)
            if first is not None:
                await sse.send({**chunk, "choices": [first]})
        async for index, out in outputs(streams):
            if out.token_ids or out.text:
                await sse.send({**chunk, "choices": [fmt.stream_choice(index, out, None)]})
            if out.finished:
                tokens[index] = out.num_output_tokens
                finish = fmt.stream_choice(index, None, out.finish_reason)
                await sse.send({**chunk, "choices": [finish]})
        if call.include_usage:
            total = sum(tokens.values())
            await sse.send({**chunk, "choices": [], "usage": usage(streams, call.n or 1,
                                                                 total).model_dump()})
        await sse.done()
    except EngineError as exc:
        error = api_error(exc)
        with contextlib.suppress(ConnectionError):
            await sse.fail(error_body(error.status, error.message, code=error.code))
    except ConnectionError:
        pass  # the client went away; answer() aborts the requests
    return sse.response
