"""Coalescing of a streamed body into fewer, larger chunks: each item of a Ray Serve
stream costs a fixed amount of CPU in the replica, the ingress and the proxy, so
sending one item per engine step per request caps throughput well below the engine's.
Ray Serve LLM does the same (``stream_batching_interval_ms``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp


async def coalesced(content: aiohttp.StreamReader, interval: float) -> AsyncIterator[bytes]:
    """The bytes of ``content`` as they arrive, merged so that at most one chunk goes
    out per ``interval`` seconds (0: every read at once, merging only what is already
    buffered). The first bytes go out at once; later bytes wait at most ``interval``.
    """
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
