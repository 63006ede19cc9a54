"""Helpers for the Ray Serve tests: the app on a local Ray instance (2 replicas, the
prefix router), replica ids, SSE over aiohttp."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

#: CI sets this so that a missing or unstartable Ray fails the run instead of skipping.
REQUIRED = os.environ.get("AIOSERVE_REQUIRE_RAY") == "1"

APP_NAME = "aioserve"
REPLICA_PREFIX = "SERVE_REPLICA::aioserve#EngineReplica#"


def skip_without_serve() -> None:
    """Skip the calling test module where Ray Serve (the ``[ray]`` extra) is not installed;
    where :data:`REQUIRED` (CI), raise the ImportError instead."""
    import pytest

    try:
        from ray import serve  # noqa: F401
    except ImportError as exc:
        if REQUIRED:
            raise
        pytest.skip(f"Ray Serve tests need aioserve[ray] ({exc})", allow_module_level=True)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def with_repo_on_path(repo: str) -> None:
    """Put the checkout first on the PYTHONPATH that Ray's workers inherit, so replicas
    run the code under test."""
    paths = [repo, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


@contextlib.contextmanager
def serving(repo: str, config: Any, server: Any, options: Any, required: bool) -> Iterator[str]:
    """The app (``start``'s arguments) on a fresh local Ray instance of 2 CPUs, on a free
    loopback port: its base URL; Serve and Ray shut down after. Skips the test when Ray
    cannot start, unless ``required`` (CI), where it fails."""
    import pytest
    import ray
    from ray import serve

    from aioserve.deploy.ray_serve import start

    with_repo_on_path(repo)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as exc:  # no Ray here (e.g. no shared memory): say why, skip
        if required:
            raise
        pytest.skip(f"cannot start a local Ray instance: {exc!r}")
    try:
        yield start(config, server, options, port=free_port())
    finally:
        serve.shutdown()
        ray.shutdown()


def replica_ids() -> list[str]:
    """Ids of the live engine replicas (from their named actors)."""
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return sorted(n[len(REPLICA_PREFIX):] for n in names if n.startswith(REPLICA_PREFIX))


def kill_replica(replica_id: str) -> None:
    """Kill one engine replica's actor (Serve then starts a new replica)."""
    import ray

    ray.kill(ray.get_actor(REPLICA_PREFIX + replica_id, namespace="serve"), no_restart=False)


@dataclass
class Stream:
    """One streamed call: who served it and every SSE payload."""

    replica: str
    status: int
    events: list[Any] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(e["choices"][0]["text"] for e in self.events
                       if isinstance(e, dict) and e.get("choices"))

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"

    @property
    def error(self) -> dict[str, Any] | None:
        last = self.events[-1] if self.events else None
        return last["error"] if isinstance(last, dict) and "error" in last else None


async def read_events(response: aiohttp.ClientResponse, stream: Stream) -> Stream:
    """Append every ``data:`` payload of ``response`` to ``stream``."""
    async for raw in response.content:
        line = raw.decode("utf-8").strip()
        if line.startswith("data: "):
            data = line[len("data: "):]
            stream.events.append(data if data == "[DONE]" else json.loads(data))
    return stream


async def stream_call(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Stream:
    """POST a streamed completion and read it to the end."""
    async with session.post(url + "/v1/completions", json={**body, "stream": True}) as resp:
        stream = Stream(resp.headers.get("x-aioserve-replica", ""), resp.status)
        return await read_events(resp, stream)
