"""``GET /ws``: a websocket on which one client runs many streamed generations.

Client messages: ``{"type": "generate", "id": "r1", "prompt": "..." | [ids], "max_tokens": 20,
...sampling fields}`` and ``{"type": "cancel", "id": "r1"}``. Server messages:
``{"type": "token", "id", "text", "token_ids"}``, then ``{"type": "done", "id",
"finish_reason", "usage"}``, or ``{"type": "error", "id", "message"}``. A bad message
gets an error message and the socket stays open; a closed socket aborts its requests.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import weakref
from typing import Any

from aiohttp import WSMsgType, web

from aioserve.errors import EngineError
from aioserve.sampling_params import SamplingParams
from aioserve.server.params import sampling_params_from_json

SOCKETS_KEY: web.AppKey[weakref.WeakSet[web.WebSocketResponse]] = web.AppKey("websockets")
_connection_ids = itertools.count()


async def close_all(app: web.Application) -> None:
    """On shutdown: close every open websocket (1001, going away)."""
    for ws in list(app.get(SOCKETS_KEY, ())):
        await ws.close(code=1001, message=b"server shutdown")


class Connection:
    """One websocket's requests: client id -> the task streaming it."""

    def __init__(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        from aioserve.server.app import ENGINE_KEY

        self.engine = request.app[ENGINE_KEY]
        self.ws = ws
        self.prefix = f"ws{next(_connection_ids)}-"
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def send(self, message: dict[str, Any]) -> None:
        if not self.ws.closed:
            await self.ws.send_json(message)

    async def on_text(self, data: str) -> None:
        try:
            message = json.loads(data)
        except json.JSONDecodeError as exc:
            await self.send({"type": "error", "id": None, "message": f"invalid JSON: {exc}"})
            return
        if not isinstance(message, dict):
            await self.send({"type": "error", "id": None, "message": "a message must be a JSON object"})
            return
        client_id = message.get("id")
        kind = message.get("type")
        if not isinstance(client_id, str) or not client_id:
            await self.send({"type": "error", "id": None, "message": "id must be a non-empty string"})
        elif kind == "generate":
            await self.start(client_id, message)
        elif kind == "cancel":
            task = self.tasks.pop(client_id, None)
            if task is not None:
                task.cancel()
        else:
            await self.send({"type": "error", "id": client_id,
                             "message": "type must be 'generate' or 'cancel'"})

    async def start(self, client_id: str, message: dict[str, Any]) -> None:
        if client_id in self.tasks:
            await self.send({"type": "error", "id": client_id,
                             "message": f"id {client_id!r} is already running on this socket"})
            return
        try:
            params = sampling_params_from_json(message)
            prompt = message.get("prompt")
            stream = self.engine.generate(prompt, params, request_id=self.prefix + client_id)
        except ValueError as exc:
            await self.send({"type": "error", "id": client_id, "message": str(exc)})
            return
        self.tasks[client_id] = asyncio.create_task(self.pump(client_id, stream, params))

    async def pump(self, client_id: str, stream: Any, params: SamplingParams) -> None:
        try:
            async for out in stream:
                if out.token_ids or out.text:
                    await self.send({"type": "token", "id": client_id, "text": out.text,
                                     "token_ids": out.token_ids})
                if out.finished:
                    usage = {"prompt_tokens": out.num_prompt_tokens,
                             "completion_tokens": out.num_output_tokens}
                    await self.send({"type": "done", "id": client_id,
                                     "finish_reason": out.finish_reason, "usage": usage})
        except (ValueError, EngineError) as exc:
            await self.send({"type": "error", "id": client_id, "message": str(exc)})
        finally:
            await stream.aclose()
            if self.tasks.get(client_id) is asyncio.current_task():
                del self.tasks[client_id]

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def handle(request: web.Request) -> web.WebSocketResponse:
    """``GET /ws``: serve one websocket until the client closes it."""
    ws = web.WebSocketResponse(heartbeat=30.0)
    await ws.prepare(request)
    sockets = request.app.setdefault(SOCKETS_KEY, weakref.WeakSet())
    sockets.add(ws)
    connection = Connection(request, ws)
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await connection.on_text(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await connection.send({"type": "error", "id": None, "message": "send text frames"})
    finally:
        await connection.close()
    return ws
