"""A trace window against a live server (issue 32): Mooncake's prefix blocks reach the
server's prefix cache as they reach the simulator's, and the live sweep counts as the
simulated one."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestServer

from aioserve import AsyncEngine, EngineConfig
from aioserve.bench.online.serving import run_serving
from aioserve.bench.online.sweep import live_sweep
from aioserve.server import create_app
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.scenarios import load_workload


async def test_mooncake_prefix_hits_on_a_live_server_match_the_simulator(model_dir, tmp_path):
    rows = [{"timestamp": 50 * i, "input_length": 2048 + 37 * i, "output_length": 64,
             "hash_ids": [0, 1, 2, 10 + i, 20 + i]} for i in range(4)]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    spec = f"{path}:len_scale=1/32,max_len=512"
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=1))  # one at a time
    server = TestServer(create_app(engine), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        records, _, _ = await run_serving(url, load_workload(spec), at_arrivals=True,
                                          endpoint="completions")
        curve, _ = await live_sweep(url, f"{spec},n=4", [4.0], 1, vocab_size=512,
                                 slo_ttft_ms=1e9, slo_tpot_ms=1e9, endpoint="completions")
    finally:
        await server.close()
    assert [r.cached_tokens for r in records] == [0, 48, 48, 48]  # blocks 0, 1, 2: 3 x 16
    simulated = await simulate(load_workload(spec), "fcfs",
                               SimConfig(slots=1, enable_prefix_caching=True, max_model_len=512))
    assert sorted(r.num_cached_tokens for r in simulated.finished.values()) == [0, 48, 48, 48]
    point = curve.runs[0][0]
    assert (point.attainment, point.counted) == (1.0, 4)  # under 10 arrivals, none dropped
    assert point.goodput == pytest.approx(4.0, rel=1e-3)
