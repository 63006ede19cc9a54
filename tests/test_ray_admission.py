"""The admission limit behind Ray Serve: a flood of one replica with a tiny limit (one slot,
one waiting, Serve's queue of one beyond three ongoing) is answered 429 with ``Retry-After``
by the engine (``max_waiting``) or by Serve's ``max_queued_requests``; every other answer
is a completion with its full tokens, never a 5xx. A local Ray instance on loopback."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from conftest import REPO
from ray_support import REQUIRED, serving, skip_without_serve

skip_without_serve()

pytestmark = [pytest.mark.ray]

MODEL_NAME = "stories"
#: Requests sent at once, and the tokens each asks for (long enough that three overlap).
FLOOD, MAX_TOKENS = 16, 128


@pytest.fixture(scope="module")
def endpoint(model_dir):
    """One engine replica (one slot, ``max_waiting`` 1) behind Serve's queue bound of one."""
    from aioserve import EngineConfig
    from aioserve.deploy.ray_serve import RayServeOptions
    from aioserve.server import ServerConfig

    config = EngineConfig(model=model_dir, device="cpu", max_num_seqs=1, max_waiting=1)
    options = RayServeOptions(num_replicas=1, ray_actor_options={"num_cpus": 0.5},
                              max_ongoing_requests=3, max_queued_requests=1)
    with serving(str(REPO), config, ServerConfig(served_model_name=MODEL_NAME), options,
                 REQUIRED) as url:
        yield url


async def answer(session: aiohttp.ClientSession, url: str) -> tuple[int, dict, dict]:
    """(status, headers, JSON or text body) of one completion."""
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True}
    async with session.post(url + "/v1/completions", json=body) as response:
        text = await response.text()
        try:
            parsed = await response.json(content_type=None)
        except ValueError:
            parsed = {"text": text}
        return response.status, dict(response.headers), parsed


async def flood(url: str, rounds: int = 1) -> list[tuple[int, dict, dict]]:
    """``rounds`` floods of ``FLOOD`` requests at once, one after the other."""
    timeout = aiohttp.ClientTimeout(total=300)
    answers = []
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(rounds):
            answers += await asyncio.gather(*(answer(session, url) for _ in range(FLOOD)))
    return answers


def test_a_flood_gets_completions_or_429_with_retry_after(endpoint):
    answers = asyncio.run(flood(endpoint, rounds=3))
    statuses = sorted(status for status, _, _ in answers)
    assert set(statuses) <= {200, 429}, [a for a in answers if a[0] not in (200, 429)]
    for status, headers, body in answers:
        if status == 200:
            assert body["usage"]["completion_tokens"] == MAX_TOKENS, body
        else:
            assert int(headers["Retry-After"]) >= 1, headers
    refusals = [str(body) for status, _, body in answers if status == 429]
    # each 429 is the engine's own limit (per replica) or Serve's queue bound (the ingress's
    # handle or the proxy); which of them says no first is a race
    assert refusals and all("max_waiting 1" in r or "max_queued_requests=1" in r
                            for r in refusals), refusals
    assert 200 in statuses, statuses
