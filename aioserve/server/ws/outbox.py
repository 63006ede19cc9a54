"""The outgoing side of the server's websockets: per socket, a bounded queue of messages
and the writer that sends them (a client that stops reading pauses its own streams
only); on shutdown, the last messages flushed and every socket closed."""

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
    """Messages queued for one websocket, sent in order by :meth:`run`.

    Args:
        ws: the prepared websocket.
        max_pending: most messages queued; a sender waits while the queue is full.
        stall_timeout: seconds a sender may wait for room before the client counts as
            stalled (it stopped reading).

    Attributes:
        stalled: True once a sender waited ``stall_timeout`` seconds; nothing more is
            queued after that.
    """

    def __init__(self, ws: web.WebSocketResponse, max_pending: int, stall_timeout: float) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=max_pending)
        self.stall_timeout = stall_timeout
        self.stalled = False

    async def run(self) -> None:
        """Send the queued messages until the socket closes or the client is gone (the
        writer task; a failure other than a lost connection is raised)."""
        with contextlib.suppress(ConnectionError):
            while not self.ws.closed:
                await self.ws.send_str(await self.queue.get())
                self.queue.task_done()

    async def put(self, message: dict[str, Any]) -> bool:
        """Queue ``message`` (JSON-encoded here); waits while the queue is full.

        Returns:
            True when queued; False when the socket is closed or the client stalled
            (then :attr:`stalled` is set). A queued message is never dropped, and one
            that waits is queued in full or not at all when its sender is cancelled.
        """
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


async def close_socket(ws: web.WebSocketResponse, code: int, reason: bytes,
                       timeout: float = 1.0) -> None:
    """Close ``ws`` with ``code``, at most ``timeout`` seconds (a client that does not
    read cannot hold it open); errors of a socket already gone are ignored."""
    with contextlib.suppress(Exception), anyio.move_on_after(timeout):
        await ws.close(code=code, message=reason)


async def close_all(app: web.Application) -> None:
    """On shutdown: send what each socket has queued (at most ``FLUSH_TIMEOUT``), then
    close every open websocket (1001, going away)."""
    async with anyio.create_task_group() as group:
        for outbox in list(app.get(OUTBOXES_KEY, ())):
            group.start_soon(outbox.flush, FLUSH_TIMEOUT)
    for ws in list(app.get(SOCKETS_KEY, ())):
        await close_socket(ws, 1001, b"server shutdown", 2.0)
