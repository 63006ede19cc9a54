"""Issue 13: a server an operator can run: API key, CORS, the KV budget as memory, the
start-up summary and the periodic stats line."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from server_support import base_url, scripted_engine, serve

from aioserve import EngineConfig
from aioserve.cli import build_parser
from aioserve.commands.common import engine_config
from aioserve.commands.memory_size import MemoryBudget, parse_memory
from aioserve.server import ServerConfig
from aioserve.server.state import default_model_name

KEY = "sk-test-123"
REPO = Path(__file__).resolve().parents[1]


async def test_api_key_guards_v1_websockets_and_metrics_but_not_health(tokenizer):
    engine = scripted_engine(tokenizer, [300, 2])
    async with serve(engine, ServerConfig(api_key=KEY)) as server, \
            aiohttp.ClientSession() as http:
        url = base_url(server)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            async with http.get(url + "/v1/models", headers=headers) as r:
                assert r.status == 401
                error = (await r.json())["error"]
                assert error["code"] == "invalid_api_key" and error["type"]
                assert "API key" in error["message"]
        good = {"Authorization": f"Bearer {KEY}"}
        async with http.get(url + "/v1/models", headers=good) as r:
            assert r.status == 200
        body = {"model": "scripted", "prompt": "Once", "max_tokens": 2}
        async with http.post(url + "/v1/completions", json=body) as r:
            assert r.status == 401
        async with http.post(url + "/v1/completions", json=body, headers=good) as r:
            assert r.status == 200
        for path in ("/health", "/openapi.json", "/"):
            async with http.get(url + path) as r:
                assert r.status == 200, path
        for path in ("/metrics", "/dashboard/session"):
            async with http.get(url + path) as r:
                assert r.status == 401, path
            async with http.get(url + path, headers=good) as r:
                assert r.status == 200, path
        for path in ("/ws", "/ws/stats"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect(url + path)
            assert info.value.status == 401
            async with http.ws_connect(url + path, headers=good):
                pass
        async with http.ws_connect(url + f"/ws/stats?api_key={KEY}") as ws:
            assert (await ws.receive_json(timeout=10))["type"] == "frame"


async def test_cors_preflight_and_headers_for_allowed_origins_only(tokenizer):
    engine = scripted_engine(tokenizer, [300, 2])
    config = ServerConfig(api_key=KEY, allowed_origins=("http://app.example",))
    async with serve(engine, config) as server, aiohttp.ClientSession() as http:
        url = base_url(server) + "/v1/completions"
        preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
        async with http.options(url, headers=preflight) as r:
            assert r.status == 200
            assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"
            assert "AUTHORIZATION" in r.headers["Access-Control-Allow-Headers"].upper()
        async with http.options(url, headers={**preflight, "Origin": "http://evil"}) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
        headers = {"Origin": "http://app.example", "Authorization": f"Bearer {KEY}"}
        body = {"model": "scripted", "prompt": "Once", "max_tokens": 2}
        async with http.post(url, json=body, headers=headers) as r:
            assert r.status == 200
            assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"


def test_memory_sizes_and_fractions():
    assert parse_memory("2GiB") == MemoryBudget(bytes=2 * 1024**3)
    assert parse_memory("512 MiB") == MemoryBudget(bytes=512 * 1024**2)
    assert parse_memory("1.5GB") == MemoryBudget(bytes=1_500_000_000)
    assert parse_memory("0.9") == parse_memory("90%") == MemoryBudget(fraction=0.9)
    for bad in ("", "lots", "2XB", "0", "150%", "-1GiB"):
        with pytest.raises(ValueError):
            parse_memory(bad)


def test_cli_kv_cache_memory_and_api_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("AIOSERVE_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "--model", "m", "--kv-cache-memory", "90%"])
    assert args.api_key == "from-env"
    config = engine_config(args)
    assert config.kv_cache_memory_fraction == 0.9
    args = build_parser().parse_args(["serve", "--model", "m", "--kv-cache-memory", "2GiB"])
    assert engine_config(args).kv_cache_memory_bytes == 2 * 1024**3
    args.kv_cache_memory = "plenty"
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        engine_config(args)
    with pytest.raises(ValueError, match="kv_cache_memory_fraction"):
        EngineConfig(model="m", kv_cache_memory_fraction=1.5)


async def read_lines(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while raw := await stream.readline():
        lines.append(raw.decode(errors="replace").rstrip())


async def wait_for_line(lines: list[str], pattern: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in lines if re.search(pattern, line)]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no line matching {pattern!r} in {lines}"
        await asyncio.sleep(0.05)


async def test_serve_prints_a_summary_and_stats_lines(model_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "AIOSERVE_API_KEY": KEY}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioserve.cli", "serve", "--model", model_dir, "--port", "0",
        "--kv-cache-memory", "1MiB", "--max-num-seqs", "8", "--stats-log-interval", "0.2",
        "--log-level", "info", "--scheduler", "vtc", "--scheduler-config", '{"preempt": false}',
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    errors: list[str] = []
    reader = asyncio.create_task(read_lines(proc.stderr, errors))
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 90)
        url = line.decode().split()[-1]
        kv = await wait_for_line(errors, r"^\s+KV cache\s")
        blocks = int(re.search(r"(\d+) blocks x 16 tokens", kv).group(1))
        assert blocks > 0 and "budget: 1.00 MiB" in kv
        for field in ("model", "device", "dtype", "context length", "slots", "scheduler",
                      "threads"):
            await wait_for_line(errors, rf"^\s+{field}\s")
        served = await wait_for_line(errors, r"^\s+served as\s")
        assert served.split()[2] == default_model_name(model_dir) == Path(model_dir).name
        scheduler = await wait_for_line(errors, r"^\s+scheduler\s")
        assert scheduler.split(None, 1)[1] == (
            'vtc {"prompt_weight": 1.0, "output_weight": 2.0, "weights": null, '
            '"preempt": false, "watermark": 0.01}')
        body = {"model": served.split()[2], "prompt": "Once upon a time", "max_tokens": 300,
                "ignore_eos": True}
        headers = {"Authorization": f"Bearer {KEY}"}
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 60
            while not any("running:" in line for line in errors):
                assert time.monotonic() < deadline, "no stats line"
                replies = await asyncio.gather(*(
                    http.post(url + "/v1/completions", json=body, headers=headers)
                    for _ in range(8)))
                assert all(r.status == 200 for r in replies)
        stats = await wait_for_line(errors, r"running: \d+ reqs, waiting: \d+ reqs, KV cache: "
                                            r"[\d.]+%, generation: [\d.]+ tokens/s")
        assert "aioserve.serve" in stats
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await asyncio.gather(reader, return_exceptions=True)


async def test_example_chat_template_serves_chat_and_the_400_points_to_it(tokenizer):
    template = (REPO / "examples" / "chat_template.jinja").read_text()
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]
    body = {"model": "scripted", "messages": messages, "max_tokens": 2}
    with_template = ServerConfig(chat_template=template)
    async with serve(scripted_engine(tokenizer, [300, 2]), with_template) as server, \
            aiohttp.ClientSession() as http, \
            http.post(base_url(server) + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
    async with serve(scripted_engine(tokenizer, [300, 2])) as server, \
            aiohttp.ClientSession() as http, \
            http.post(base_url(server) + "/v1/chat/completions", json=body) as r:
        assert r.status == 400
        error = (await r.json())["error"]
        assert error["param"] == "messages"
        assert "--chat-template" in error["message"]
        assert "examples/chat_template.jinja" in error["message"]


async def test_custom_scheduler_example_run_alone_compares_policies():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "examples" / "custom_scheduler.py"),
        stdout=asyncio.subprocess.PIPE, env=env)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    assert proc.returncode == 0
    for policy in ("fcfs", "fair_share"):
        for who in ("alice", "bob"):
            assert re.search(rf"^\s*{policy}\s+{who}: mean latency [\d.]+ s$", text, re.M), text


def test_kv_cache_memory_budget_sets_the_block_count(model_dir):
    from aioserve.runners.torch.runner import TorchRunner
    from aioserve.runners.torch.setup import free_memory_bytes

    runner = TorchRunner(EngineConfig(model=model_dir, kv_cache_memory_bytes=1 << 20))
    try:
        assert runner.num_kv_blocks == (1 << 20) // runner.kv_block_bytes
    finally:
        runner.close()
    assert free_memory_bytes(runner.device) > 0
