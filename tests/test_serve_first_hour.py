"""Issue 26, item 7: what a new user sees of ``aioserve serve``. At the default log level
no weight-loading bar and no access-log line per request (``--log-level debug`` shows
both); a relative ``--model`` path is served under the directory's own name (never a
filesystem path: issue 52), in ``/v1/models``, every response, ``/openapi.json`` and the
dashboard, the path as given and the absolute path still accepted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp


async def serve_and_call(model_dir: str, *options: str) -> tuple[dict, list[str]]:
    """Start ``aioserve serve`` on a relative ``--model`` path, make calls, stop it;
    returns what the calls saw and the server's stderr lines."""
    cwd = Path(model_dir).parent.parent
    relative = os.path.relpath(model_dir, cwd)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("AIOSERVE_API_KEY", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioserve.cli", "serve", "--model", relative, "--port", "0",
        "--stats-log-interval", "0", *options, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    seen: dict = {"relative": relative}
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        url = line.decode().split()[-1]
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/v1/models") as r:
                seen["models"] = await r.json()
            body = {"prompt": "Once upon a time", "max_tokens": 3}
            for name in (None, relative, str(Path(model_dir).resolve()), "other"):
                payload = body if name is None else {**body, "model": name}
                async with http.post(url + "/v1/completions", json=payload) as r:
                    seen.setdefault("statuses", []).append(r.status)
                    if name is None:
                        seen["completion"] = await r.json()
            async with http.get(url + "/") as r:
                seen["page"] = await r.text()
            async with http.get(url + "/openapi.json") as r:
                seen["openapi"] = await r.text()
            async with http.ws_connect(url + "/ws/stats") as ws:
                seen["frame"] = json.loads((await ws.receive()).data)
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, stderr.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return seen, stderr.decode(errors="replace").splitlines()


async def test_default_level_is_quiet_and_a_relative_model_is_served_by_its_name(model_dir):
    seen, lines = await serve_and_call(model_dir)
    name = Path(model_dir).resolve().name
    path = str(Path(model_dir).resolve())
    assert not os.path.isabs(seen["relative"]) and name != seen["relative"]
    assert [m["id"] for m in seen["models"]["data"]] == [name]
    assert seen["models"]["data"][0]["root"] == name
    assert seen["completion"]["model"] == name
    assert seen["statuses"] == [200, 200, 200, 404]  # the path as given, the absolute path
    for route in ("page", "openapi"):  # open routes: no filesystem path
        assert path not in seen[route] and seen["relative"] not in seen[route], route
    assert json.dumps(seen["models"]).count(path) == 0
    assert f"aioserve · {name}" in seen["page"]
    assert seen["frame"]["model"] == name
    assert not [line for line in lines if "Loading weights" in line], lines
    assert not [line for line in lines if "aiohttp.access" in line], lines
    assert any("engine ready" in line for line in lines)


async def test_debug_level_shows_the_loading_bar_and_each_request(model_dir):
    _, lines = await serve_and_call(model_dir, "--log-level", "debug")
    assert any("Loading weights" in line for line in lines)
    assert any("aiohttp.access" in line and "POST /v1/completions" in line for line in lines)
