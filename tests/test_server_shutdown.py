"""``aioserve serve`` shuts down gracefully on SIGTERM and SIGINT: it stops accepting,
lets an in-flight stream finish, and exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp
from server_support import scripted_engine, sse_events

from aioserve.commands.serve import serve
from aioserve.server import create_app


async def test_sigterm_lets_the_in_flight_stream_finish_and_exits_0(model_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioserve.cli", "serve", "--model", model_dir, "--port", "0",
        "--num-kv-blocks", "64", "--served-model-name", "tiny",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 90)
        assert line.startswith(b"listening on http://127.0.0.1:"), line
        url = line.decode().split()[-1]
        async with aiohttp.ClientSession() as s:
            body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 40,
                    "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            response = await s.post(url + "/v1/completions", json=body)
            await response.content.readline()
            proc.send_signal(signal.SIGTERM)
            events = await sse_events(response)
            assert events[-1] == "[DONE]"
            assert events[-2]["usage"]["completion_tokens"] == 40  # finished, not cut
            assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_sigint_in_process_stops_accepting_and_returns(tokenizer):
    app = create_app(scripted_engine(tokenizer, [300]))
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(app, "127.0.0.1", 0, 5.0, on_ready=ready.set_result))
    url = await asyncio.wait_for(ready, 10)
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(task, 10)
        try:
            async with s.get(url + "/health"):
                raise AssertionError("still accepting")
        except aiohttp.ClientConnectionError:
            pass
