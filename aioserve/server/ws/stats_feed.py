"""``GET /ws/stats``: live engine frames for the dashboard, for any number of viewers.

One :class:`StatsFeed` per app listens to the engine (``AsyncEngine.add_listener``):
finished requests always (for latency percentiles), step snapshots only while at
least one viewer is connected, at most ``1 / interval`` a second. Each frame is
encoded once and offered to every viewer's queue of ``queue_size`` frames; a viewer
whose queue is full loses its oldest frame, so a slow viewer sees fewer frames and
never slows the engine or the other viewers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from aiohttp import WSMsgType, web

from aioserve.dashboard.frames import FrameMaker
from aioserve.engine import AsyncEngine
from aioserve.engine.observation import StepSnapshot
from aioserve.errors import EngineNotRunningError
from aioserve.request import Request
from aioserve.server.ws.ws_outbox import SOCKETS_KEY, bound_send_buffer


class StatsFeed:
    """Fans engine frames out to dashboard viewers.

    Args:
        engine: the engine watched.
        model: the model name the page shows.
        interval: least seconds between two frames (0.1: at most 10 a second).
        queue_size: frames kept per viewer before the oldest is dropped.
    """

    def __init__(self, engine: AsyncEngine, model: str, interval: float = 0.1,
                 queue_size: int = 2) -> None:
        self.engine = engine
        self.interval = interval
        self.queue_size = queue_size
        self.frames = FrameMaker(model)
        self.viewers: set[asyncio.Queue[str]] = set()
        self.num_dropped = 0

    def attach(self) -> None:
        """Start listening for finished requests."""
        self.engine.add_listener(self, step_interval=None)

    def detach(self) -> None:
        """Stop listening."""
        self.engine.remove_listener(self)

    def subscribe(self) -> asyncio.Queue[str]:
        """A new viewer's queue, holding the current frame."""
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=self.queue_size)
        if not self.viewers:
            self.engine.add_listener(self, step_interval=self.interval)
        self.viewers.add(queue)
        with contextlib.suppress(EngineNotRunningError):
            queue.put_nowait(json.dumps(self.frames.frame(self.engine.snapshot())))
        return queue

    def unsubscribe(self, queue: asyncio.Queue[str]) -> None:
        """Forget a viewer; with none left, stop asking for step snapshots."""
        self.viewers.discard(queue)
        if not self.viewers:
            self.engine.remove_listener(self)
            self.engine.add_listener(self, step_interval=None)

    def on_step(self, snapshot: StepSnapshot) -> None:
        """Engine listener: encode one frame and offer it to every viewer."""
        if not self.viewers:
            return
        data = json.dumps(self.frames.frame(snapshot))
        for queue in self.viewers:
            if queue.full():
                queue.get_nowait()
                self.num_dropped += 1
            queue.put_nowait(data)

    def on_finish(self, request: Request) -> None:
        """Engine listener: add the request's latencies to the window."""
        self.frames.record_finished(request)


STATS_FEED_KEY: web.AppKey[StatsFeed] = web.AppKey("stats_feed", StatsFeed)


async def handle(request: web.Request) -> web.WebSocketResponse:
    """``GET /ws/stats``: send frames (``{"type": "frame", ...}``) until the viewer
    closes the socket; messages from the viewer are ignored."""
    feed = request.app[STATS_FEED_KEY]
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=4096)
    await ws.prepare(request)
    bound_send_buffer(request, 64 * 1024)
    request.app[SOCKETS_KEY].add(ws)
    queue = feed.subscribe()

    async def write() -> None:
        with contextlib.suppress(ConnectionError):
            while not ws.closed:
                await ws.send_str(await queue.get())

    writer = asyncio.create_task(write())
    try:
        async for msg in ws:
            if msg.type == WSMsgType.ERROR:
                break
    finally:
        feed.unsubscribe(queue)
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    return ws

