"""Noticing that an HTTP client has gone away while its handler waits on the engine."""

from __future__ import annotations

import asyncio
from types import TracebackType

from aiohttp import web

#: Seconds between checks of the connection.
POLL_INTERVAL = 0.05


class DisconnectWatch:
    """Cancel the current handler task when its client's connection closes.

    aiohttp cancels handlers itself only when the server runs with
    ``handler_cancellation=True``; this watch makes a handler that waits on the engine
    (a non-streaming call, or a stream still queued) stop within ``POLL_INTERVAL``
    either way, so its requests are aborted and their KV blocks freed.

    Use as ``async with DisconnectWatch(request):``; the body sees ``CancelledError``.
    """

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self._task: asyncio.Task[None] | None = None
        self.disconnected = False

    async def __aenter__(self) -> DisconnectWatch:
        handler = asyncio.current_task()
        assert handler is not None
        self._task = asyncio.create_task(self._watch(handler))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self, handler: asyncio.Task[object]) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL)
            transport = self.request.transport
            if transport is None or transport.is_closing():
                self.disconnected = True
                handler.cancel()
                return
