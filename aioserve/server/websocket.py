"""``GET /ws``: a websocket on which one client runs many streamed generations.

Client messages: ``{"type": "generate", "id": "r1", "prompt": "..." | [ids], "max_tokens": 20,
...sampling fields}`` and ``{"type": "cancel", "id": "r1"}``. Server messages:
``{"type": "token", "id", "text", "token_ids"}``, then ``{"type": "done", "id",
"finish_reason", "usage"}`` (``finish_reason: "abort"`` after a cancel), or
``{"type": "error", "id", "message", "param", "code"}``.

A bad message gets an error message and the socket stays open (a text frame that is
not UTF-8 closes it with 1007, a message over ``max_body_bytes`` with 1009, as aiohttp
does). Outgoing messages wait in a bounded queue per socket: when a client stops
reading, its generations pause; after ``ws_stall_timeout`` seconds its requests are
aborted and the socket closes with 1008. Other sockets are never slowed. A closed
socket aborts all of its requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import weakref
from typing import Any

from aiohttp import WSMsgType, web

from aioserve.errors import EngineError
from aioserve.server.body import check_text, is_text
from aioserve.server.choices import Choices
from aioserve.server.errors import ApiError
from aioserve.server.logprobs import CompletionLogprobs, TokenText
from aioserve.server.openai_call import engine_error, served
from aioserve.server.schema import RequestFieldError, WsGenerate, field_of_message, parse
from aioserve.server.state import CONFIG_KEY, ENGINE_KEY, ServerConfig

SOCKETS_KEY: web.AppKey[weakref.WeakSet[web.WebSocketResponse]] = web.AppKey("websockets")
CONNECTIONS_KEY: web.AppKey[weakref.WeakSet[Connection]] = web.AppKey("ws_connections")
_connection_ids = itertools.count()
#: Most generations one socket may run at once.
MAX_REQUESTS_PER_SOCKET = 256


#: Seconds a socket's queued messages (e.g. the error that ends a stream) get to go
#: out before the server closes it on shutdown.
FLUSH_TIMEOUT = 1.0


async def close_all(app: web.Application) -> None:
    """On shutdown: send what each socket has queued (at most ``FLUSH_TIMEOUT``), then
    close every open websocket (1001, going away)."""
    connections = list(app.get(CONNECTIONS_KEY, ()))
    await asyncio.gather(*(c.flush(FLUSH_TIMEOUT) for c in connections))
    for ws in list(app.get(SOCKETS_KEY, ())):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(code=1001, message=b"server shutdown"), 2.0)


def _client_id(message: dict[str, Any]) -> str | None:
    client_id = message.get("id")
    return client_id if isinstance(client_id, str) and is_text(client_id) else None


class Stalled(Exception):
    """The client did not read for ``ws_stall_timeout`` seconds."""


class Connection:
    """One websocket: its running generations and its bounded outgoing queue."""

    def __init__(self, app: web.Application, ws: web.WebSocketResponse,
                 tenant: str | None = None) -> None:
        self.app = app
        self.tenant = tenant  # the upgrade request's X-Tenant: every message's tenant
        self.engine = app[ENGINE_KEY]
        self.config: ServerConfig = app[CONFIG_KEY]
        self.ws = ws
        self.prefix = f"ws{next(_connection_ids)}-"
        self.running: dict[str, tuple[asyncio.Task[None], Choices]] = {}
        self.outbox: asyncio.Queue[str] = asyncio.Queue(maxsize=self.config.ws_max_pending)
        self.stalled = False
        self.token_text = TokenText(self.engine.tokenizer)
        self.writer = asyncio.create_task(self._write())

    async def _write(self) -> None:
        with contextlib.suppress(ConnectionError):
            while not self.ws.closed:
                await self.ws.send_str(await self.outbox.get())
                self.outbox.task_done()

    async def flush(self, timeout: float) -> None:
        """Wait until every queued message is sent (at most ``timeout`` seconds)."""
        if self.writer.done():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.outbox.join(), timeout)

    async def send(self, message: dict[str, Any]) -> None:
        """Queue a message; waits while the queue is full.

        Raises:
            Stalled: the queue stayed full for ``ws_stall_timeout`` seconds (the socket
                is then being closed with 1008 and every request aborted).
        """
        if self.stalled or self.ws.closed:
            return
        data = json.dumps(message)
        try:
            self.outbox.put_nowait(data)
            return
        except asyncio.QueueFull:
            pass
        try:
            await asyncio.wait_for(self.outbox.put(data), self.config.ws_stall_timeout)
        except asyncio.TimeoutError:
            if not self.stalled:
                self.stalled = True
                asyncio.create_task(self._close_stalled())
            raise Stalled from None

    async def _close_stalled(self) -> None:
        for client_id in list(self.running):
            self.cancel(client_id, notify=False)
        self.writer.cancel()
        with contextlib.suppress(Exception):  # a client that does not read gets 1 s
            await asyncio.wait_for(self.ws.close(code=1008, message=b"send buffer full"), 1.0)

    async def error(self, client_id: str | None, message: str, param: str | None = None,
                    code: str = "invalid_request") -> None:
        """Send an error message about ``client_id`` (None: about the message itself)."""
        await self.send({"type": "error", "id": client_id, "message": message,
                         "param": param, "code": code})

    async def on_text(self, data: str) -> None:
        """Handle one client message; any fault is answered with an error message."""
        try:
            message = json.loads(data)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            await self.error(None, f"invalid JSON: {exc}", code="invalid_json")
            return
        if not isinstance(message, dict):
            await self.error(None, "a message must be a JSON object", code="invalid_json")
            return
        try:
            check_text(message)
        except ApiError as exc:
            await self.error(_client_id(message), exc.message, exc.param, "invalid_encoding")
            return
        client_id = message.get("id")
        kind = message.get("type")
        if not isinstance(client_id, str) or not client_id or len(client_id) > 256:
            await self.error(None, "id must be a string of 1 to 256 characters", "id")
        elif kind == "generate":
            await self.start(client_id, message)
        elif kind == "cancel":
            if client_id not in self.running:
                await self.error(client_id, f"no request with id {client_id!r} is running on "
                                 "this socket", "id", "unknown_id")
            self.cancel(client_id, notify=True)
        else:
            await self.error(client_id, "type must be 'generate' or 'cancel'", "type")

    async def start(self, client_id: str, message: dict[str, Any]) -> None:
        """Start a generation for ``client_id``."""
        if client_id in self.running:
            await self.error(client_id, f"id {client_id!r} is already running on this socket",
                             "id", "duplicate_request_id")
            return
        if len(self.running) >= MAX_REQUESTS_PER_SOCKET:
            await self.error(client_id, f"at most {MAX_REQUESTS_PER_SOCKET} requests may run "
                             "on one socket", "id", "too_many_requests")
            return
        try:
            generate = parse(WsGenerate, message, served(self.app))
            params = generate.sampling_params(logprobs=generate.logprobs)
            meta = generate.request_meta(self.tenant)
            choices = Choices(self.engine, [generate.prompt], [params], 1,
                              self.prefix + client_id, meta)
        except RequestFieldError as exc:
            code = exc.code if exc.code != "invalid_value" else "invalid_request"
            await self.error(client_id, str(exc), exc.param, code)
            return
        except EngineError as exc:
            await self.error(client_id, str(exc), None, engine_error(exc).code or "")
            return
        except ValueError as exc:
            await self.error(client_id, str(exc), field_of_message(str(exc), "prompt"))
            return
        task = asyncio.create_task(self.pump(client_id, choices))
        self.running[client_id] = (task, choices)

    def cancel(self, client_id: str, *, notify: bool) -> None:
        """Abort ``client_id``'s generation now (unknown ids are ignored)."""
        entry = self.running.pop(client_id, None)
        if entry is None:
            return
        task, choices = entry
        choices.close()
        task.cancel()
        if notify:
            prompt = choices.prompt_tokens
            completion = choices.streams[0].request.num_output_tokens
            usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion,
                     "prompt_tokens_details": {"cached_tokens": choices.cached_tokens}}
            done = {"type": "done", "id": client_id, "finish_reason": "abort", "usage": usage}
            with contextlib.suppress(asyncio.QueueFull):
                self.outbox.put_nowait(json.dumps(done))

    async def pump(self, client_id: str, choices: Choices) -> None:
        """Forward one generation's outputs to the socket."""
        logprobs = CompletionLogprobs(self.token_text)
        try:
            async for _, out in choices:
                if out.token_ids or out.text:
                    token = {"type": "token", "id": client_id, "text": out.text,
                             "token_ids": out.token_ids}
                    if out.logprobs is not None:
                        token["logprobs"] = logprobs.delta(out.logprobs)
                    await self.send(token)
                if out.finished:
                    await self.send({"type": "done", "id": client_id,
                                     "finish_reason": out.finish_reason, "usage": out.usage})
        except EngineError as exc:
            with contextlib.suppress(Stalled):
                await self.error(client_id, str(exc), None, engine_error(exc).code or "")
        except Stalled:
            pass
        finally:
            choices.close()
            if self.running.get(client_id, (None,))[0] is asyncio.current_task():
                del self.running[client_id]

    async def close(self) -> None:
        """Abort every generation of this socket and stop its writer."""
        entries = list(self.running.values())
        self.running.clear()
        for task, choices in entries:
            choices.close()
            task.cancel()
        self.writer.cancel()
        await asyncio.gather(self.writer, *(t for t, _ in entries), return_exceptions=True)


def bound_send_buffer(request: web.Request, size: int) -> None:
    """Bound what one socket buffers for a slow client: the transport's high-water mark
    and the kernel's send buffer (which would otherwise grow to megabytes)."""
    transport = request.transport
    if transport is None:
        return
    transport.set_write_buffer_limits(high=size)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


async def handle(request: web.Request) -> web.WebSocketResponse:
    """``GET /ws``: serve one websocket until the client closes it."""
    config = request.app[CONFIG_KEY]
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=config.max_body_bytes)
    await ws.prepare(request)
    bound_send_buffer(request, config.ws_send_buffer_bytes)
    request.app[SOCKETS_KEY].add(ws)
    connection = Connection(request.app, ws, request.headers.get("X-Tenant"))
    request.app[CONNECTIONS_KEY].add(connection)
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await connection.on_text(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await connection.error(None, "send JSON in text frames", code="invalid_frame")
    except Stalled:
        pass
    finally:
        await connection.close()
    return ws
