"""benchmarks/serving/gpu_anchor.py keeps working (tiny config on the CPU, run as a user
runs it), and the CUDA path runs where a GPU exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aioserve import AsyncEngine, EngineConfig, SamplingParams

REPO = Path(__file__).resolve().parents[1]
ANCHOR = REPO / "benchmarks" / "serving" / "gpu_anchor.py"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_gpu_anchor_tiny_runs_both_engines():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run(
        [sys.executable, str(ANCHOR), "--tiny", "--num-requests", "4", "--device", "cpu",
         "--json"], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["aioserve"]["output_tokens"] == figures["transformers_cb"]["output_tokens"] > 0
    assert figures["aioserve"]["tokens_per_s"] > 0
    assert figures["transformers_cb"]["tokens_per_s"] > 0


@pytest.mark.gpu
@needs_cuda
async def test_cuda_bf16_engine_generates(model_dir):
    config = EngineConfig(model=model_dir, device="cuda", max_num_seqs=8)
    async with AsyncEngine(config) as engine:
        assert engine.runner.dtype == torch.bfloat16
        params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        outs = await asyncio_gather_collect(engine, [[1, 403, 407], [1, 261, 378, 300]], params)
    assert [len(o) for o in outs] == [12, 12]


@pytest.mark.gpu
@needs_cuda
async def test_cuda_fp32_greedy_matches_cpu(model_dir):
    """fp32 on CUDA is not bit-exact with the CPU; require the first tokens to agree."""
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [[1, 403, 407, 261, 378], [1, 300]]
    results = []
    for device in ("cpu", "cuda"):
        config = EngineConfig(model=model_dir, device=device, dtype="float32", max_num_seqs=4)
        async with AsyncEngine(config) as engine:
            results.append(await asyncio_gather_collect(engine, prompts, params))
    assert [r[:4] for r in results[0]] == [r[:4] for r in results[1]]


async def asyncio_gather_collect(engine, prompts, params):
    import asyncio

    async def one(prompt):
        return [t async for out in engine.generate(prompt, params) for t in out.token_ids]

    return await asyncio.gather(*(one(p) for p in prompts))
