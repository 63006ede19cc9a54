"""bfloat16 on the CPU: exact in a batch (a request's greedy tokens beside others equal its
tokens alone, as in float32) on every architecture the float32 coverage serves, packed oneDNN
products whose rows ignore the batch, and ``--dtype auto``/``float16`` decided from the CPU."""

from __future__ import annotations

import asyncio

import pytest
import torch

from aioserve import AsyncEngine, EngineConfig
from aioserve.bench.models import coverage
from aioserve.cli import main
from aioserve.runners.cpu import native_dtypes, packed_linear
from aioserve.runners.torch import setup
from tests.test_arch_coverage import ARCHITECTURES, PROMPTS, assert_lively
from tests.test_engine_batch_invariance import staggered, staggered_workload

needs_bf16 = pytest.mark.skipif(not packed_linear.native_bf16(),
                                reason="oneDNN runs no native bfloat16 on this CPU")

EPYC = "flags : fpu sse avx avx2 fma avx512f avx512_bf16"


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_each_architecture_is_batch_invariant_in_bfloat16(model_type, model_dir, tmp_path):
    coverage.save(model_type, tmp_path, model_dir)
    together = asyncio.run(coverage.serve(tmp_path, PROMPTS, 8, dtype="bfloat16"))
    alone = asyncio.run(coverage.serve(tmp_path, PROMPTS, 8, max_num_seqs=1,
                                       dtype="bfloat16"))
    assert together == alone
    assert_lively(alone)


async def served(model_dir: str, workload, max_num_seqs: int) -> list[list[int]]:
    config = EngineConfig(model=model_dir, max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
                          block_size=8, dtype="bfloat16", device="cpu")
    async with AsyncEngine(config) as engine:
        return await staggered(engine, workload, join=max_num_seqs > 1)


@pytest.mark.parametrize("packed", [False, pytest.param(True, marks=needs_bf16)])
def test_staggered_requests_equal_their_solo_runs_in_bfloat16(model_dir, monkeypatch, packed):
    if packed:  # the test model is small: pack it as a real one is (oneDNN's bf16 kernels)
        monkeypatch.setattr(packed_linear, "MIN_PARAMETERS", 0)
    workload = staggered_workload()
    together = asyncio.run(served(model_dir, workload, 4))
    alone = asyncio.run(served(model_dir, workload, 1))
    assert together == alone
    assert len({t for ids in alone for t in ids}) > 4


@needs_bf16
@pytest.mark.parametrize(("out_features", "in_features"),
                         [(960, 576), (576, 576), (3072, 576), (576, 1536)])
def test_packed_bfloat16_rows_ignore_their_batch(out_features, in_features):
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(out_features, in_features, generator=generator) / 24).bfloat16()
    packed = packed_linear.pack_weight(weight)
    rows = torch.randn(96, in_features, generator=generator).bfloat16()
    full = packed_linear.linear_pointwise(rows, packed)
    torch.testing.assert_close(full.float(), (rows.float() @ weight.float().T), rtol=2e-2,
                               atol=2e-2)
    for count in (1, 2, 7, 16, 31, 32, 33, 64, 95):
        assert torch.equal(packed_linear.linear_pointwise(rows[:count], packed), full[:count])


def test_native_dtypes_follow_the_cpu_flags():
    assert native_dtypes.native_dtypes(EPYC) == ["float32", "bfloat16"]
    assert native_dtypes.native_dtypes("flags : avx2 fma") == ["float32"]
    assert native_dtypes.native_dtypes("flags : avx512_bf16 avx512_fp16") == [
        "float32", "bfloat16", "float16"]


def test_float16_is_refused_on_a_cpu_without_native_half():
    with pytest.raises(ValueError, match=r"--dtype float16: .* float32, bfloat16 natively"):
        native_dtypes.check_dtype("float16", "cpu", EPYC)
    native_dtypes.check_dtype("float16", "cpu", EPYC + " avx512_fp16")
    native_dtypes.check_dtype("float16", "cuda", EPYC)
    native_dtypes.check_dtype("bfloat16", "cpu", "flags : avx2")


@pytest.mark.skipif("float16" in native_dtypes.native_dtypes(),
                    reason="this CPU runs float16 natively")
@pytest.mark.parametrize("command", [["bench", "throughput"], ["generate", "x"]])
def test_cli_refuses_float16_before_the_model_loads(model_dir, capsys, command):
    assert main([*command, "--model", model_dir, "--device", "cpu", "--dtype", "float16"]) == 2
    err = capsys.readouterr().err
    assert "--dtype float16" in err and "natively" in err


def test_auto_is_the_checkpoints_dtype_where_native_else_float32():
    both = ["float32", "bfloat16"]
    assert native_dtypes.auto_dtype("bfloat16", both).dtype == "bfloat16"
    slow = native_dtypes.auto_dtype("bfloat16", ["float32"])
    assert slow.dtype == "float32" and "no native bfloat16" in slow.reason
    half = native_dtypes.auto_dtype("float16", both)
    assert half.dtype == "float32" and "float16" in half.reason
    assert native_dtypes.auto_dtype("float32", both).dtype == "float32"
    assert native_dtypes.auto_dtype(None, both).dtype == "float32"


def test_resolve_auto_logs_its_choice(caplog):
    caplog.set_level("INFO", logger="aioserve.dtype")
    want = torch.bfloat16 if packed_linear.native_bf16() and "bfloat16" in \
        native_dtypes.native_dtypes() else torch.float32
    assert setup.resolve_dtype("auto", torch.device("cpu"), "bfloat16") == want
    assert "dtype auto: " in caplog.text
    assert setup.resolve_dtype("auto", torch.device("cpu"), "float32") == torch.float32
    assert setup.resolve_dtype("float32", torch.device("cpu"), "bfloat16") == torch.float32
