"""CASES BUG-23: a websocket client that stops reading is paused, then its requests
are aborted and its socket closed (1008); other clients are not slowed; churn of
hard-closed sockets leaks nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct

import aiohttp
from server_support import base_url, idle, metric, scripted_engine, serve, wait_until

from aioserve.server import ServerConfig

CONFIG = ServerConfig(ws_max_pending=8, ws_stall_timeout=0.3, ws_send_buffer_bytes=1024)


def text_frame(text: str) -> bytes:
    """A masked client text frame (RFC 6455)."""
    payload = text.encode()
    mask = os.urandom(4)
    n = len(payload)
    header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                              bytes([0x80 | 126]) + struct.pack("!H", n))
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def silent_client(host: str, port: int, message: dict) -> socket.socket:
    """Open a websocket with a tiny receive buffer, send one message, never read again."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.setblocking(False)
    await loop.sock_connect(sock, (host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    await loop.sock_sendall(sock, (
        f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += await loop.sock_recv(sock, 1)
    assert head.startswith(b"HTTP/1.1 101")
    await loop.sock_sendall(sock, text_frame(json.dumps(message)))
    return sock


async def stream_tokens(session, url: str, n: int) -> int:
    """Run one websocket generation of ``n`` tokens; returns the tokens received."""
    async with session.ws_connect(url + "/ws") as ws:
        await ws.send_json({"type": "generate", "id": "b", "prompt": "hi", "max_tokens": n,
                            "ignore_eos": True})
        tokens = 0
        while (msg := await ws.receive_json(timeout=30))["type"] == "token":
            tokens += 1
        assert msg["type"] == "done"
    return tokens


async def silent_generation(server) -> socket.socket:
    """A socket that starts a 50,000-token generation and never reads."""
    return await silent_client(server.host, server.port, {
        "type": "generate", "id": "a", "prompt": "hi", "max_tokens": 50_000,
        "ignore_eos": True})


PATIENT = ServerConfig(ws_max_pending=8, ws_stall_timeout=600, ws_send_buffer_bytes=1024)


async def test_bug23_a_client_that_never_reads_does_not_hold_up_others(tokenizer):
    """While A does not read (and is not yet cut off), other sockets stream in full:
    A's generation pauses, theirs do not wait for it."""
    engine = scripted_engine(tokenizer, [300, 301], max_model_len=60_000, num_kv_blocks=4000)
    async with serve(engine, PATIENT) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        sock = await silent_generation(server)
        try:
            await wait_until(lambda: engine.stats()["num_running"] == 1)
            tokens = await asyncio.gather(*(stream_tokens(s, url, 300) for _ in range(4)))
            assert tokens == [300] * 4
            assert engine.stats()["num_running"] == 1  # A still there, paused
        finally:
            sock.close()
        await wait_until(lambda: idle(engine))  # closing A's socket aborted it


async def test_bug23_a_client_that_never_reads_is_cut_off(tokenizer):
    engine = scripted_engine(tokenizer, [300, 301], max_model_len=60_000, num_kv_blocks=4000)
    async with serve(engine, CONFIG) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        sock = await silent_generation(server)
        try:
            await wait_until(lambda: engine.stats()["num_running"] == 1)
            await wait_until(lambda: idle(engine))  # A was aborted after the stall timeout
            async with s.get(url + "/metrics") as r:
                text = await r.text()
            assert metric(text, "aioserve:request_success_total",
                          'finished_reason="abort"') == 1
            assert metric(text, "aioserve:generation_tokens_total") < 50_000
        finally:
            sock.close()


async def test_bug23_churn_of_hard_closed_sockets_leaks_nothing(tokenizer):
    engine = scripted_engine(tokenizer, [300, 301], num_kv_blocks=64)
    async with serve(engine, CONFIG) as server:
        url = base_url(server)
        baseline = engine.stats()["num_free_blocks"]
        tasks_before = len(asyncio.all_tasks())
        for _ in range(150):
            async with aiohttp.ClientSession() as s:
                ws = await s.ws_connect(url + "/ws")
                await ws.send_json({"type": "generate", "id": "x", "prompt": "hi",
                                    "max_tokens": 400, "ignore_eos": True})
                for _ in range(2):
                    await ws.receive_json(timeout=30)
                ws._response.connection.transport.abort()  # hard close, no close frame
        await wait_until(lambda: idle(engine))
        await wait_until(lambda: len(asyncio.all_tasks()) <= tasks_before)
        assert engine.stats()["num_free_blocks"] == baseline
        assert engine._delivery.streams == {}
