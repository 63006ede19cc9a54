"""Merging a streamed body into fewer chunks (no Ray)."""

from __future__ import annotations

import asyncio

from aioserve.deploy.coalesce import coalesced


class Reader:
    """A stand-in for aiohttp's StreamReader: ``readany`` returns what was fed."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def readany(self) -> bytes:
        return await self.queue.get()


async def test_first_bytes_go_at_once_later_ones_are_merged_until_the_end():
    reader = Reader()
    chunks = coalesced(reader, interval=3600.0)
    reader.queue.put_nowait(b"a")
    assert await anext(chunks) == b"a"
    for part in (b"b", b"c", b"d", b""):
        reader.queue.put_nowait(part)
    assert [chunk async for chunk in chunks] == [b"bcd"]


async def test_without_interval_every_read_goes_out():
    reader = Reader()
    for part in (b"a", b"b", b""):
        reader.queue.put_nowait(part)
    assert [chunk async for chunk in coalesced(reader, interval=0.0)] == [b"a", b"b"]


async def test_merged_bytes_go_out_when_the_interval_ends_without_more_data():
    reader = Reader()
    chunks = coalesced(reader, interval=0.01)
    reader.queue.put_nowait(b"a")
    assert await anext(chunks) == b"a"
    reader.queue.put_nowait(b"b")
    assert await asyncio.wait_for(anext(chunks), 60) == b"b"  # no EOF was fed
