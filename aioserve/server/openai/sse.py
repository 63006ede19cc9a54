"""Server-Sent Events for the streaming OpenAI endpoints: ``data: {json}`` events,
ended by ``data: [DONE]`` (or by an error event)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class SSEStream:
    """One streaming response.

    Writes raise ``ConnectionResetError`` once the client has gone away; the caller
    then stops (and aborts its engine requests).

    Args:
        request: the HTTP request being answered.
        headers: headers sent besides :data:`SSE_HEADERS`.
    """

    def __init__(self, request: web.Request, headers: dict[str, str] | None = None) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers={**SSE_HEADERS, **(headers or {})})

    async def start(self) -> None:
        """Send the status line and headers."""
        await self.response.prepare(self.request)

    async def send(self, data: dict[str, Any]) -> None:
        """Send one ``data:`` event holding ``data`` as JSON (ASCII, so always valid UTF-8)."""
        await self.response.write(b"data: " + json.dumps(data).encode() + b"\n\n")

    async def done(self) -> None:
        """Send ``data: [DONE]`` and end the response."""
        await self.response.write(b"data: [DONE]\n\n")
        await self.response.write_eof()

    async def fail(self, error: dict[str, Any]) -> None:
        """Send an error event (``data: {"error": {...}}``, which the ``openai`` client
        raises as ``APIError``) and end the response without ``[DONE]``."""
        await self.send(error)
        await self.response.write_eof()
