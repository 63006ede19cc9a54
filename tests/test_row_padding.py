"""A request's decode logits are the same bits alone and in a batch of any size
(row_padding.py: MKL's products and ATen's elementwise loops computed a call's last
rows with other kernels; paged_metadata.MIN_CONTEXT_WIDTH: so did short score products).

What the padding measures (MKL's row groups, ATen's vector width, the threads' split)
differs between machines, so the checks also run in subprocesses under every ATen
CPU capability this CPU has below its own (``ATEN_CPU_CAPABILITY=default``, ``avx2``
on an AVX-512 machine) and under MKL's reproducibility mode ``MKL_CBWR=AVX2`` (another
small-row kernel); under ``MKL_CBWR=COMPATIBLE``, and under ``MKL_CBWR=AVX2`` on an
AVX-512 CPU, no count is exact: the runner packs its linear layers (decode steps stay
exact) and says what stays inexact. Issues 26 (item 6) and 34 (item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from isa_support import cpu_level

from aioserve.config import EngineConfig
from aioserve.runners.cpu.row_padding import (
    GRAIN_SIZE,
    RowPadding,
    elementwise_chunk,
    probe_row_padding,
)
from aioserve.runners.torch.runner import TorchRunner
from aioserve.runners.torch.setup import PREFILL_ATTENTION_ON_MKL

TESTS = Path(__file__).resolve().parent

NUM_SEQUENCES = 13
BLOCKS_PER_SEQUENCE = 8


def test_padding_table_only_grows_counts_and_leaves_big_counts():
    table = probe_row_padding([torch.randn(24, 16), torch.randn(40, 24)], max_rows=20)
    assert table.targets[0] == 0
    assert all(target >= rows for rows, target in enumerate(table.targets))
    assert len(table.targets) == 21
    assert table.padded(500) == 500
    assert not RowPadding([0, 1, 2]).needed
    assert RowPadding([0, 4, 4]).needed


def differing_values(count: int) -> torch.Tensor:
    """``count`` floats (tiled) whose SiLU differs between ATen's vector and scalar
    paths, so any element a scalar tail computes shows (empty: the paths agree)."""
    values = 8 * torch.rand(512, generator=torch.Generator().manual_seed(1)) - 4
    vector = F.silu(values)
    scalar = torch.cat([F.silu(values[i:i + 1]) for i in range(len(values))])
    differing = values[vector != scalar]
    if len(differing) == 0:
        return differing
    return differing.repeat(-(-count // len(differing)))[:count]


def test_elementwise_chunk_is_where_the_scalar_tail_starts():
    chunk = elementwise_chunk()
    values = differing_values(4096)
    if chunk == 1:
        assert len(values) == 0  # vector and scalar paths agree: no tail effect
        return
    assert chunk in (8, 16, 32, 64)  # two vectors of floats: AVX2 16, AVX-512 32
    full = F.silu(values)
    exact = [n for n in range(1, 300) if torch.equal(F.silu(values[:n]), full[:n])]
    assert exact == list(range(chunk, 300, chunk))


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_padded_steps_split_elementwise_ops_on_chunk_boundaries(threads):
    """Every thread's range of an elementwise op over a padded step ends on a chunk
    boundary, so no row of it takes the scalar tail: SiLU over ``[rows, width]`` equals
    the same elements of one long single-thread call, for steps past the grain size."""
    table = probe_row_padding([torch.randn(172, 64), torch.randn(64, 172)], max_rows=32,
                              widths=[8])
    values = differing_values(700 * 172)
    if len(values) == 0:
        pytest.skip("ATen's vector and scalar SiLU agree here: nothing to align")
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        reference = F.silu(values)
        torch.set_num_threads(threads)
        for rows in range(150, 700, 37):
            padded = table.padded(rows)
            assert padded >= rows and padded % table.multiple == 0
            for width in (172, 64, 8):
                numel = padded * width
                assert torch.equal(F.silu(values[:numel]), reference[:numel]), (
                    rows, padded, width, numel > GRAIN_SIZE)
    finally:
        torch.set_num_threads(saved)


def decode_differences(model_dir: str, forward: str) -> tuple[dict[int, list[int]], str]:
    """Batch sizes -> the rows whose decode logits differ from the same row alone; and
    the runner's reason for not being exact ("" where it is)."""
    runner = TorchRunner(EngineConfig(model=model_dir, forward=forward, num_kv_blocks=128,
                                      device="cpu"))
    rng = np.random.default_rng(3)
    lengths = rng.integers(5, 100, NUM_SEQUENCES).astype(np.int64)
    first = 4  # blocks 0-3 belong to the lean forward's load check
    tables = np.arange(first, first + NUM_SEQUENCES * BLOCKS_PER_SEQUENCE,
                       dtype=np.int64).reshape(NUM_SEQUENCES, BLOCKS_PER_SEQUENCE)
    tokens = torch.from_numpy(rng.integers(3, runner.vocab_size, NUM_SEQUENCES))

    def run() -> dict[int, list[bool]]:
        with torch.inference_mode():
            for i, length in enumerate(lengths):  # each prompt alone
                ids = torch.from_numpy(rng.integers(3, runner.vocab_size, int(length)))
                runner._run_model(ids, np.zeros(1, np.int64), lengths[i:i + 1],
                                  tables[i:i + 1], torch.tensor([length - 1]), runner.lean)

            def decode(rows: list[int]) -> torch.Tensor:
                return runner._run_model(
                    tokens[rows], lengths[rows], np.ones(len(rows), np.int64), tables[rows],
                    torch.arange(len(rows)), runner.lean)

            alone = [decode([i])[0] for i in range(NUM_SEQUENCES)]
            return {size: [torch.equal(row, alone[i]) for i, row in
                           enumerate(decode(list(range(size))))]
                    for size in (2, 3, 5, 6, 7, 9, 11, 13)}

    try:
        same = runner._executor.submit(run).result()
    finally:
        runner.close()
    return {size: [i for i, ok in enumerate(rows) if not ok]
            for size, rows in same.items() if not all(rows)}, runner.row_padding.reason


@pytest.mark.parametrize("forward", ["transformers", "lean-llama"])
def test_decode_logits_alone_equal_logits_in_every_batch_size(model_dir, forward):
    """Contexts of 5-99 tokens, so a sequence alone attends one to seven blocks and in
    a batch as many as its longest batch-mate."""
    differing, reason = decode_differences(model_dir, forward)
    assert reason == ""
    assert not differing, differing


def prefill_differences(model_dir: str) -> tuple[dict[int, list[int]], str]:
    """Prompt counts -> the prompts whose last logits differ from the same prompt alone
    (transformers' forward); and the runner's reason for not being exact ("" where it
    is)."""
    runner = TorchRunner(EngineConfig(model=model_dir, forward="transformers",
                                      num_kv_blocks=128, device="cpu"))
    rng = np.random.default_rng(5)
    lengths = rng.integers(5, 60, 8).astype(np.int64)
    tables = np.arange(4, 4 + 8 * 4, dtype=np.int64).reshape(8, 4)
    prompts = [torch.from_numpy(rng.integers(3, runner.vocab_size, int(n))) for n in lengths]

    def prefill(rows: list[int]) -> torch.Tensor:
        counts = lengths[rows]
        return runner._run_model(
            torch.cat([prompts[i] for i in rows]), np.zeros(len(rows), np.int64), counts,
            tables[rows], torch.from_numpy(np.cumsum(counts) - 1), None)

    def run() -> dict[int, list[int]]:
        with torch.inference_mode():
            alone = [prefill([i])[0] for i in range(len(prompts))]
            return {size: [i for i, row in enumerate(prefill(list(range(size))))
                           if not torch.equal(row, alone[i])] for size in (2, 3, 5, 8)}

    try:
        return runner._executor.submit(run).result(), runner.row_padding.reason
    finally:
        runner.close()


def test_prompt_logits_alone_equal_logits_beside_other_prompts(model_dir):
    """Prefill steps of 1-8 prompts (5-59 tokens each; 8 prompts are 267 tokens, whose
    SiLU over 172 columns the threads split): each prompt's last logits are the same
    bits alone and packed with the others."""
    differing, reason = prefill_differences(model_dir)
    assert reason == ""
    assert not any(differing.values()), differing


def capabilities_below_this_cpus() -> list[str]:
    """ATen CPU capabilities this CPU runs, other than the one it picks itself."""
    order = ["default", "avx2", "avx512"]
    own = torch.backends.cpu.get_cpu_capability().lower()
    return order[:order.index(own)] if own in order else ["default"]


CHECK = """
import json, sys, torch
import test_row_padding as t
model = sys.argv[1]
decode = {f: t.decode_differences(model, f) for f in ("transformers", "lean-llama")}
prefill, reason = t.prefill_differences(model)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                  "decode": {f: differing for f, (differing, _) in decode.items()},
                  "prefill": prefill,
                  "reasons": sorted({reason, *(r for _, r in decode.values())})}))
"""


def run_check(model_dir: str, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code, model_dir], capture_output=True,
                          text=True, timeout=900, cwd=TESTS,
                          env={**os.environ, "PYTHONPATH": path, **env})


@pytest.mark.parametrize("setting", [*(f"ATEN_CPU_CAPABILITY={c}"
                                       for c in capabilities_below_this_cpus()),
                                     "MKL_CBWR=AVX2"])
def test_logits_stay_exact_under_other_isas_and_kernels(model_dir, setting):
    """The same checks with ATen's loops of another vector width (or scalar), or MKL on
    its reproducible AVX2 path (whose small-row kernels differ from its default's).

    On Intel's AVX-512 CPUs, MKL's AVX2 path computes calls of different sizes with
    different kernels, so no row padding makes its products exact (row_padding.py; on AMD's
    EPYC the probe finds exact counts and all is exact): the runner
    packs its linear layers, and decode steps are exact as everywhere, but attention
    over a prefill step's prompts still runs on MKL; there, and only there, the runner
    says so (its reason) and a prompt's first logits may differ beside other prompts."""
    name, value = setting.split("=")
    result = run_check(model_dir, CHECK, **{name: value})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if name == "ATEN_CPU_CAPABILITY":
        assert report["capability"].lower() == value
    assert report["decode"] == {"transformers": {}, "lean-llama": {}}, report
    if name == "MKL_CBWR" and report["reasons"] != [""]:
        # The probe found no exact row count (Intel's AVX-512 CPUs): said, not hidden.
        assert cpu_level() == "avx512", report
        assert report["reasons"] == [PREFILL_ATTENTION_ON_MKL], report
    else:
        # Exact rows found (every ATen width; MKL's AVX2 path on AMD's EPYC): all exact.
        assert report["reasons"] == [""], report
        assert not any(report["prefill"].values()), report


def test_a_machine_where_no_count_is_exact_is_said_not_hidden(model_dir):
    """With ``MKL_CBWR=COMPATIBLE`` no row count gives MKL's rows their bits in a large
    call: the probe says so (``exact`` False, its reason); the runner then packs its
    linear layers and says, with a warning, what stays inexact (prefill attention)."""
    code = ("import sys, torch\n"
            "from aioserve.config import EngineConfig\n"
            "from aioserve.runners.cpu.row_padding import probe_row_padding\n"
            "from aioserve.runners.torch.runner import TorchRunner\n"
            "weights = [torch.randn(172, 64), torch.randn(64, 172)]\n"
            "table = probe_row_padding(weights)\n"
            "print(table.exact, probe_row_padding(weights[:1]).exact)\n"
            "print(table.reason)\n"
            "runner = TorchRunner(EngineConfig(model=sys.argv[1], num_kv_blocks=16))\n"
            "print(runner.row_padding.exact, type(runner.model.lm_head).__name__)\n"
            "print(runner.row_padding.reason)\n"
            "runner.close()\n")
    result = run_check(model_dir, code, MKL_CBWR="COMPATIBLE")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()[-4:]
    assert lines[0] == "False False"
    assert lines[1].startswith("some step sizes give rows other bits than alone on this "
                               "machine (MKL's products")
    assert lines[2:] == ["False PackedLinear", PREFILL_ATTENTION_ON_MKL]
    assert f"row padding: {PREFILL_ATTENTION_ON_MKL}" in result.stderr
