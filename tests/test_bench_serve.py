"""``aioserve bench serve`` against a live server, over SSE and the websocket."""

from __future__ import annotations

import asyncio
import math
import os
import sys

import pytest
from aiohttp.test_utils import TestServer

from aioserve import AsyncEngine, EngineConfig, RequestMeta
from aioserve.bench.online.serving import (
    AuthenticationError,
    arrival_gaps,
    run_serving,
)
from aioserve.reports.outcome import Outcome
from aioserve.reports.serving import summarize
from aioserve.reports.serving_plots import plot_serving
from aioserve.reports.stats import percentile
from aioserve.server import ServerConfig, create_app
from aioserve.workloads.synthetic import prefix_repetition_requests, random_requests


@pytest.mark.parametrize("endpoint", ["auto", "completions", "ws"])
async def test_serve_benchmark_against_real_server(model_dir, tmp_path, endpoint):
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=8))
    server = TestServer(create_app(engine), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        requests = random_requests(6, (4, 16), (3, 8), vocab_size=512, seed=1)
        records, duration, used = await run_serving(url, requests, request_rate=50.0,
                                                    endpoint=endpoint, seed=1)
    finally:
        await server.close()
    assert used == ("completions" if endpoint == "auto" else endpoint)
    assert all(r.ok for r in records), [r.error for r in records]
    assert [r.output_tokens for r in records] == [r.output_len for r in requests]
    result = summarize(records, duration, used, slo_ttft_ms=1e9, slo_tpot_ms=1e9)
    assert result.completed == 6 and result.failed == 0
    assert result.metrics["goodput"] == pytest.approx(result.metrics["request_throughput"])
    for name in ("ttft", "tpot", "itl", "e2e"):
        assert result.metrics[name]["median_ms"] >= 0
    assert plot_serving(records, tmp_path / "serve.png").stat().st_size > 0


def test_summary_statistics_and_slo():
    fast = Outcome("f", 0.0, 4, 3, 0.1, 0.3, 0.3, token_times=(0.1, 0.2, 0.3))
    slow = Outcome("s", 0.0, 4, 3, 1.0, 2.0, 2.0, token_times=(1.0, 1.5, 2.0))
    failed = Outcome("x", 0.0, 4, error="HTTP 500")
    result = summarize([fast, slow, failed], 2.0, "ws", slo_ttft_ms=500, slo_tpot_ms=math.inf)
    assert (result.completed, result.failed) == (2, 1)
    assert result.metrics["ttft"]["mean_ms"] == pytest.approx(550)
    assert result.metrics["tpot"]["median_ms"] == pytest.approx(300)
    assert result.metrics["goodput"] == pytest.approx(0.5)
    assert "TTFT" in result.summary()
    assert result.metrics["failures"] == {"HTTP 500": 1} and "HTTP 500" in result.summary()


def test_percentile_and_arrivals():
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5
    assert percentile([1, 2, 3, 4, 10], 99) == pytest.approx(9.76) and percentile([], 50) is None
    assert arrival_gaps(3, math.inf, 0) == [0.0, 0.0, 0.0]
    gaps = arrival_gaps(2000, 10.0, 0)
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)


async def test_serve_benchmark_reports_prefix_cache_hits(model_dir):
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=1))  # one at a time
    server = TestServer(create_app(engine), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        requests = prefix_repetition_requests(4, 40, 4, 1, (2, 2), vocab_size=512, seed=2)
        records, duration, used = await run_serving(url, requests, request_rate=math.inf,
                                                    endpoint="completions", seed=1)
    finally:
        await server.close()
    assert sorted(r.cached_tokens for r in records) == [0, 32, 32, 32]  # 2 blocks of 16
    result = summarize(records, duration, used)
    assert result.metrics["prefix_hit_rate"] == pytest.approx(96 / (4 * 44))
    assert "prefix cache hits" in result.summary()


@pytest.mark.parametrize("endpoint", ["completions", "ws"])
async def test_serve_replays_a_simulator_workload(model_dir, tmp_path, endpoint):
    """The file ``aioserve simulate`` reads replays against a live server: arrival times,
    lengths, and every field a policy reads (tenant sent as ``user``)."""
    from aioserve.scheduling import OrderedScheduler
    from aioserve.workloads.request import WorkloadRequest, dump_jsonl
    from aioserve.workloads.scenarios import load_workload

    class Seen(OrderedScheduler):
        def __init__(self):
            super().__init__()
            self.views = []

        def on_arrival(self, request, state):
            self.views.append(request)

    items = [WorkloadRequest("a", 0.0, 6, 4, deadline_s=30.0, meta=RequestMeta(
                 2, "acme", ttft_slo_ms=900, tpot_slo_ms=50, metadata={"team": "x"})),
             WorkloadRequest("b", 0.05, 8, 3)]
    path = dump_jsonl(items, tmp_path / "w.jsonl")
    policy = Seen()
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=4), scheduler=policy)
    server = TestServer(create_app(engine), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        requests = load_workload(str(path))
        records, _, _ = await run_serving(url, requests, endpoint=endpoint, at_arrivals=True)
        assert engine.core is not None
        context = engine.core.max_model_len
    finally:
        await server.close()
    assert [r.output_tokens for r in records] == [4, 3]
    assert [r.prompt_len for r in records] == [6, 8]
    first = next(v for v in policy.views if v.num_prompt_tokens == 6)
    assert (first.tenant, first.priority, first.ttft_slo_ms, first.tpot_slo_ms) == (
        "acme", 2, 900, 50)
    assert dict(first.metadata) == {"team": "x"}
    assert first.deadline is not None and 25 < first.deadline - first.arrival_time <= 30
    other = next(v for v in policy.views if v.num_prompt_tokens == 8)
    assert (other.tenant, other.priority, other.deadline) == (None, 0, None)
    # no oracle: max_tokens is the context left, the stop at 4 and 3 tokens hidden
    assert [(v.params.max_tokens, v.params.length_hint) for v in (first, other)] == [
        (context - 6, None), (context - 8, None)]


async def bench_cli(url: str, **env: str) -> tuple[int, str]:
    """``aioserve bench serve`` (2 small requests) against ``url``; (status, stderr)."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OPENAI_API_KEY", "AIOSERVE_API_KEY")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioserve.cli", "bench", "serve", "--base-url", url,
        "--num-prompts", "2", "--input-len", "4:8", "--output-len", "2:3", "--no-progress",
        env={**clean, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(process.communicate(), 300)
    return process.returncode, stderr.decode()


async def test_serve_benchmark_sends_the_api_key_and_calls_a_401_an_auth_error(model_dir):
    """Issue 26, item 4: against a keyed server, ``--api-key`` (default
    ``$OPENAI_API_KEY``, then ``$AIOSERVE_API_KEY``) is sent; without it, or with a
    wrong one, the 401 is reported as an authentication failure, not "cannot reach"."""
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=8))
    server = TestServer(create_app(engine, ServerConfig(api_key="sekret")), host="127.0.0.1",
                        port=0)
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        requests = random_requests(2, (4, 8), (2, 3), vocab_size=512, seed=1)
        for endpoint in ("auto", "completions", "ws"):
            with pytest.raises(AuthenticationError, match="401.*needs an API key"):
                await run_serving(url, requests, endpoint=endpoint)
            with pytest.raises(AuthenticationError, match="401.*key was refused"):
                await run_serving(url, requests, endpoint=endpoint, api_key="wrong")
            records, _, used = await run_serving(url, requests, endpoint=endpoint,
                                                 api_key="sekret")
            assert all(r.ok for r in records), [r.error for r in records]
        status, stderr = await bench_cli(url)
        assert status == 1 and "authentication failed" in stderr, stderr
        assert "cannot reach" not in stderr
        for variable in ("OPENAI_API_KEY", "AIOSERVE_API_KEY"):
            status, stderr = await bench_cli(url, **{variable: "sekret"})
            assert status == 0, stderr
    finally:
        await server.close()
