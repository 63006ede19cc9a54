"""The outgoing side of the websockets: a bounded queue per socket and its writer (a
client that stops reading pauses its own streams only); on shutdown, a flush and close."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import weakref
from typing import Any

import anyio
from aiohttp import web

#: Every open websocket of the app (``/ws`` and ``/ws/stats``).
SOCKETS_KEY: web.AppKey[weakref.WeakSet[web.WebSocketResponse]] = web.AppKey("websockets")
#: The outbox of every open ``/ws`` socket.
OUTBOXES_KEY: web.AppKey[weakref.WeakSet[Outbox]] = web.AppKey("ws_outboxes")
#: Seconds a socket's queued messages (e.g. the error that ends a stream) get to go
#: out before the server closes it on shutdown.
FLUSH_TIMEOUT = 1.0


class Outbox:
    """Messages queued for one websocket (at most ``max_pending``), sent in order by
    :meth:`run`; ``stalled`` once a sender waited ``stall_timeout`` seconds for room."""

    def __init__(self, ws: web.WebSocketResponse, max_pending: int, stall_timeout: float) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=max_pending)
        self.stall_timeout = stall_timeout
        self.stalled = False

    async def run(self) -> None:
        """Send the queued messages until the socket closes."""
        with contextlib.suppress(ConnectionError):
            while not self.ws.closed:
                await self.ws.send_str(await self.queue.get())
                self.queue.task_done()

    async def put(self, message: dict[str, Any]) -> bool:
        """Queue ``message``, waiting while the queue is full; False when the socket is
        closed or the client stalled. A message is queued in full or not at all."""
        if self.stalled or self.ws.closed:
            return False
        data = json.dumps(message)
        try:
            self.queue.put_nowait(data)  # no suspension: the common case is atomic
            return True
        except asyncio.QueueFull:
            pass
        with anyio.move_on_after(self.stall_timeout):
            await self.queue.put(data)
            return True
        self.stalled = True
        return False

    async def flush(self, timeout: float) -> None:
        """Wait until every queued message is sent, at most ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            await self.queue.join()


def bound_send_buffer(request: web.Request, size: int) -> None:
    """Bound what one socket buffers for a slow client (transport and kernel)."""
    transport = request.transport
    if transport is None:
        return
    transport.set_write_buffer_limits(high=size)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


async def close_socket(ws: web.WebSocketResponse, code: int, reason: bytes,
                       timeout: float = 1.0) -> None:
    """Close ``ws`` with ``code`` within ``timeout`` seconds, ignoring a socket gone."""
    with contextlib.suppress(Exception), anyio.move_on_after(timeout):
        await ws.close(code=code, message=reason)


async def close_all(app: web.Application) -> None:
    """On shutdown: flush each socket's queue (``FLUSH_TIMEOUT``), then close them all."""
    async with anyio.create_task_group() as group:
        for outbox in list(app.get(OUTBOXES_KEY, ())):
            group.start_soon(outbox.flush, FLUSH_TIMEOUT)
    for ws in list(app.get(SOCKETS_KEY, ())):
        await close_socket(ws, 1001, b"server shutdown", 2.0)
