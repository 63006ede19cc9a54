"""Merging a stream into fewer chunks: each Ray Serve stream item costs fixed CPU."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp


async def coalesced(content: aiohttp.StreamReader, interval: float) -> AsyncIterator[bytes]:
    """The bytes of ``content``, at most one chunk per ``interval`` seconds."""
    loop = asyncio.get_running_loop()
    pending = bytearray()
    sent_at = -interval
    while True:
        if pending:
            remaining = sent_at + interval - loop.time()
            if remaining <= 0:
                yield bytes(pending)
                pending.clear()
                sent_at = loop.time()
                continue
            try:
                chunk = await asyncio.wait_for(content.readany(), remaining)
            except asyncio.TimeoutError:  # TimeoutError from 3.11 on
                continue
        else:
            chunk = await content.readany()
        if not chunk:
            break
        pending += chunk
    if pending:
        yield bytes(pending)
