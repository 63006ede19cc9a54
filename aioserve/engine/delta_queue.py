"""DeltaQueue: the per-request queue between the step loop and one consumer."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class DeltaQueue(Generic[T]):
    """An unbounded asyncio queue for one consumer, leaner than ``asyncio.Queue``.

    The step loop puts one item per request per step, so this is the engine's
    hottest path after the model: ``put_nowait`` appends and, only when the consumer
    is waiting, completes its one future; there is no bound, no ``task_done``
    bookkeeping and no list of getters. Not thread-safe (the event loop's thread only),
    and bound to the event loop of its consumer's first wait.

    A consumer may read :attr:`items` itself, awaiting :meth:`wait` while it is
    empty: one wake-up then takes every item queued meanwhile, with no coroutine
    per item (what :meth:`AsyncEngine.generate` does).

    Attributes:
        items: the queued items, oldest first (only the consumer pops them).
    """

    __slots__ = ("items", "_waiter", "_loop")

    def __init__(self) -> None:
        self.items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the consumer's, at its first wait

    def put_nowait(self, item: T) -> None:
        """Append ``item``; wake the consumer if it waits."""
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        """A future that completes when an item is queued (at once if one is).

        Raises:
            RuntimeError: another coroutine is already waiting on this queue.
        """
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
        """The oldest item, waiting for one if the queue is empty.

        Raises:
            RuntimeError: another coroutine is already waiting on this queue.
        """
        items = self.items
        while not items:
            await self.wait()
        return items.popleft()

    def get_nowait(self) -> T:
        """The oldest item.

        Raises:
            asyncio.QueueEmpty: the queue is empty.
        """
        if not self.items:
            raise asyncio.QueueEmpty
        return self.items.popleft()

    def qsize(self) -> int:
        """Items waiting."""
        return len(self.items)

    def empty(self) -> bool:
        """True when no item waits."""
        return not self.items
