"""``GET /ws``: one client runs many streamed generations on a websocket (the protocol is
in docs/serving.md). Each generate ends exactly once, with ``done`` or ``error``; its engine
request is named by socket, sequence number and id, so nothing late of an ended one
touches one that reuses the id. One anyio task group per socket owns its writer and
pumps: a socket that closes, stalls or loses a task cancels them all."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import anyio
from aiohttp import WSMsgType, web
from anyio.abc import TaskGroup

from aioserve.engine.output import RequestStream
from aioserve.errors import EngineError
from aioserve.server.errors import ApiError, api_error
from aioserve.server.logprobs import CompletionLogprobs, TokenText
from aioserve.server.openai.call import outputs, usage
from aioserve.server.pipeline import decode, is_text, start, validate
from aioserve.server.schema.requests import RequestFieldError, WsGenerate
from aioserve.server.state import CONFIG_KEY, ENGINE_KEY, ServerConfig
from aioserve.server.ws.outbox import (
    OUTBOXES_KEY,
    SOCKETS_KEY,
    Outbox,
    bound_send_buffer,
    close_socket,
)

logger = logging.getLogger(__name__)

_connection_ids = itertools.count()
#: Most generations one socket may run at once.
MAX_REQUESTS_PER_SOCKET = 256


def _error(client_id: str | None, message: str, param: str | None,
           code: str) -> dict[str, Any]:
    return {"type": "error", "id": client_id, "message": message, "param": param, "code": code}


def _client_id(data: str) -> str | None:
    """The id of a message refused as a whole (its text must still be valid)."""
    with contextlib.suppress(ValueError, RecursionError):
        message = json.loads(data)
        client_id = message.get("id") if isinstance(message, dict) else None
        return client_id if isinstance(client_id, str) and is_text(client_id) else None
    return None


@dataclass(eq=False)
class Generation:
    """One generate message: its stream and the cancel scope of its pump."""

    client_id: str
    stream: RequestStream
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class Connection:
    """One websocket (``tenant``: its upgrade request's ``X-Tenant``): its running
    generations (``running``: client id -> generation, until its end is queued) and outbox."""

    def __init__(self, app: web.Application, ws: web.WebSocketResponse,
                 group: TaskGroup, tenant: str | None = None) -> None:
        self.app = app
        self.tenant = tenant  # the upgrade request's X-Tenant: every message's tenant
        self.engine = app[ENGINE_KEY]
        self.config: ServerConfig = app[CONFIG_KEY]
        self.group = group
        self.prefix = f"ws{next(_connection_ids)}-"
        self._sequence = itertools.count()
        self.running: dict[str, Generation] = {}
        self.outbox = Outbox(ws, self.config.ws_max_pending, self.config.ws_stall_timeout)
        self.token_text = TokenText(self.engine.tokenizer)
        group.start_soon(self._write)

    async def _write(self) -> None:
        await self.outbox.run()
        self.group.cancel_scope.cancel()  # the socket is gone: nothing more to deliver

    def engine_id(self, client_id: str) -> str:
        return f"{self.prefix}{next(self._sequence)}-{client_id}"

    async def send(self, message: dict[str, Any]) -> None:
        """Queue a message; a client stalled for ``ws_stall_timeout`` seconds ends the socket."""
        if not await self.outbox.put(message) and self.outbox.stalled:
            self.group.cancel_scope.cancel()

    async def error(self, client_id: str | None, message: str, param: str | None = None,
                    code: str = "invalid_value") -> None:
        """Send an error message about ``client_id`` (None: about the message itself)."""
        await self.send(_error(client_id, message, param, code))

    async def on_text(self, data: str) -> None:
        """Handle one client message; any fault is answered with an error message."""
        try:
            message = decode(data, "the websocket message")
        except ApiError as exc:
            await self.error(_client_id(data), exc.message, exc.param, exc.code or "")
            return
        client_id = message.get("id")
        kind = message.get("type")
        if not isinstance(client_id, str) or not client_id or len(client_id) > 256:
            await self.error(None, "id must be a string of 1 to 256 characters", "id")
        elif kind == "generate":
            await self.start(client_id, message)
        elif kind == "cancel":
            await self.cancel(client_id)
        else:
            await self.error(client_id, "type must be 'generate' or 'cancel'", "type")

    async def start(self, client_id: str, message: dict[str, Any]) -> None:
        if client_id in self.running:
            await self.error(client_id, f"id {client_id!r} is already running on this socket",
                             "id", "duplicate_request_id")
            return
        if len(self.running) >= MAX_REQUESTS_PER_SOCKET:
            await self.error(client_id, f"at most {MAX_REQUESTS_PER_SOCKET} requests may run "
                             "on one socket", "id", "too_many_requests")
            return
        try:
            generate = validate(WsGenerate, message, self.app)
            params = generate.sampling_params(logprobs=generate.logprobs)
            meta = generate.request_meta(self.tenant)
            [stream] = start(self.engine, [generate.prompt], params, 1,
                             self.engine_id(client_id), meta, stop_after=generate.stop_after)
        except (ApiError, RequestFieldError) as exc:
            error = api_error(exc)
            await self.error(client_id, error.message, error.param, error.code or "")
            return
        generation = Generation(client_id, stream)
        self.running[client_id] = generation
        self.group.start_soon(self.pump, generation)

    async def cancel(self, client_id: str) -> None:
        """Abort ``client_id``'s generation and end it with ``done`` (``abort``)."""
        generation = self.running.pop(client_id, None)
        if generation is None:
            await self.error(client_id, f"no request with id {client_id!r} is running on "
                             "this socket", "id", "unknown_id")
            return
        generation.scope.cancel()  # its pump sends nothing more
        stream = generation.stream
        self.engine.release(stream)
        spent = usage([stream], 1, stream.request.num_output_tokens)
        await self.send({"type": "done", "id": client_id, "finish_reason": "abort",
                         "usage": spent.model_dump()})

    async def pump(self, generation: Generation) -> None:
        """Forward one generation's outputs and end it with ``done`` or ``error``."""
        client_id, stream = generation.client_id, generation.stream
        logprobs = CompletionLogprobs(self.token_text)
        end = _error(client_id, "the generation ended without a result", None, "internal_error")
        with generation.scope:
            try:
                async for _, out in outputs([stream]):
                    if self.running.get(client_id) is not generation:
                        # a cancel ended it and queued its done while this task was
                        # already woken (anyio delivers the cancel later): send no more
                        break
                    if out.token_ids or out.text:
                        token: dict[str, Any] = {"type": "token", "id": client_id,
                                                 "text": out.text, "token_ids": out.token_ids}
                        if out.logprobs is not None:
                            token["logprobs"] = logprobs.delta(out.logprobs)
                        await self.send(token)
                    if out.finished:
                        end = {"type": "done", "id": client_id,
                               "finish_reason": out.finish_reason, "usage": out.usage}
            except EngineError as exc:
                end = _error(client_id, str(exc), None, api_error(exc).code or "engine_error")
            except Exception as exc:  # a fault forwarding this generation ends it alone
                logger.exception("websocket generation %s failed", client_id)
                end = _error(client_id, f"internal error: {type(exc).__name__}: {exc}", None,
                             "internal_error")
            finally:
                self.engine.release(stream)
            if self.running.get(client_id) is generation:  # not ended by a cancel
                await self.send(end)
        if self.running.get(client_id) is generation:
            del self.running[client_id]  # its end is queued (or the socket is gone)

    def close(self) -> None:
        """Abort every generation of this socket and cancel its tasks."""
        for generation in self.running.values():
            self.engine.release(generation.stream)
        self.running.clear()
        self.group.cancel_scope.cancel()


async def handle(request: web.Request) -> web.WebSocketResponse:
    """``GET /ws``: serve one websocket until the client closes it."""
    config = request.app[CONFIG_KEY]
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=config.max_body_bytes)
    await ws.prepare(request)
    bound_send_buffer(request, config.ws_send_buffer_bytes)
    request.app[SOCKETS_KEY].add(ws)
    stalled = False
    try:
        async with anyio.create_task_group() as group:
            connection = Connection(request.app, ws, group, request.headers.get("X-Tenant"))
            request.app[OUTBOXES_KEY].add(connection.outbox)
            try:
                async for msg in ws:
                    if msg.type == WSMsgType.TEXT:
                        await connection.on_text(msg.data)
                    elif msg.type == WSMsgType.BINARY:
                        await connection.error(None, "send JSON in text frames",
                                               code="invalid_frame")
            finally:
                connection.close()
                stalled = connection.outbox.stalled
    except Exception:  # a task of this socket failed (a bug): its requests are aborted
        logger.exception("websocket connection failed")
        await close_socket(ws, 1011, b"internal error")
    if stalled:
        await close_socket(ws, 1008, b"send buffer full")
    return ws

