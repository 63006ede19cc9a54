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
    bookkeeping and no list of getters. Not thread-safe (the event loop's thread only).
    """

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: T) -> None:
        """Append ``item``; wake the consumer if it waits in :meth:`get`."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> T:
        """The oldest item, waiting for one if the queue is empty.

        Raises:
            RuntimeError: another coroutine is already waiting on this queue.
        """
        while not self._items:
            if self._waiter is not None:
                raise RuntimeError("DeltaQueue has one consumer; another is already waiting")
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:  # cancelled while waiting
                    self._waiter = None
        return self._items.popleft()

    def get_nowait(self) -> T:
        """The oldest item.

        Raises:
            asyncio.QueueEmpty: the queue is empty.
        """
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    def qsize(self) -> int:
        """Items waiting."""
        return len(self._items)

    def empty(self) -> bool:
        """True when no item waits."""
        return not self._items
