"""DeltaQueue: the per-request queue between the step loop and its one consumer."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class DeltaQueue(Generic[T]):
    """An unbounded asyncio queue for one consumer, leaner than ``asyncio.Queue`` (the
    engine's hottest path after the model): no bound, no ``task_done``, one waiter.
    Event-loop thread only. A consumer may pop :attr:`items` itself, awaiting
    :meth:`wait` while empty, so one wake-up takes every item queued meanwhile."""

    __slots__ = ("items", "_waiter", "_loop")

    def __init__(self) -> None:
        self.items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the consumer's, at its first wait

    def put_nowait(self, item: T) -> None:
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        """A future done when an item is queued; RuntimeError if another waits."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():  # a done one was cancelled
            raise RuntimeError("DeltaQueue has one consumer; another is already waiting")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        if self.items:
            self._waiter = None
            waiter.set_result(None)
        return waiter

    async def get(self) -> T:
        items = self.items
        while not items:
            await self.wait()
        return items.popleft()

    def get_nowait(self) -> T:
        if not self.items:
            raise asyncio.QueueEmpty
        return self.items.popleft()

    def qsize(self) -> int:
        return len(self.items)

    def empty(self) -> bool:
        return not self.items
