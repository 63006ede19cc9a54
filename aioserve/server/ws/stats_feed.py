"""``GET /ws/stats``: live engine frames for any number of dashboard viewers; each frame
is encoded once, and a slow viewer loses its oldest frames, never slowing the engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import WSMsgType, web

from aioserve.dashboard.frames import FrameMaker
from aioserve.engine import AsyncEngine
from aioserve.engine.observation import StepSnapshot
from aioserve.errors import EngineNotRunningError
from aioserve.request import Request
from aioserve.server.policy_report import policy_report
from aioserve.server.ws.outbox import SOCKETS_KEY, bound_send_buffer


class StatsFeed:
    """Fans engine frames (at most one per ``interval`` seconds) out to viewers' queues
    of ``queue_size`` frames."""

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
            queue.put_nowait(json.dumps(self.frame(self.engine.snapshot())))
        return queue

    def unsubscribe(self, queue: asyncio.Queue[str]) -> None:
        """Forget a viewer; with none left, stop asking for step snapshots."""
        self.viewers.discard(queue)
        if not self.viewers:
            self.engine.remove_listener(self)
            self.engine.add_listener(self, step_interval=None)

    def frame(self, snapshot: StepSnapshot) -> dict[str, Any]:
        """The dashboard frame of ``snapshot`` with the admission limit's settings
        (``admission``) and the requests it refused by reason (``refused``)."""
        frame = self.frames.frame(snapshot, policy_report(self.engine)[1])
        config, core = self.engine.config, self.engine.core
        frame["admission"] = {"max_waiting": config.max_waiting,
                              "max_queue_time_s": config.max_queue_time_s}
        frame["refused"] = dict(core.admission.refused) if core is not None else {}
        return frame

    def on_step(self, snapshot: StepSnapshot) -> None:
        """Engine listener: encode one frame and offer it to every viewer."""
        if not self.viewers:
            return
        data = json.dumps(self.frame(snapshot))
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
    """``GET /ws/stats``: send frames until the viewer closes the socket."""
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

