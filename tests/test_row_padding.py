"""A request's decode logits are the same bits alone and in a batch of any size
(row_padding.py: MKL's products and ATen's elementwise loops computed a call's last
rows with other kernels; paged_metadata.MIN_CONTEXT_WIDTH: so did short score products)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aioserve.config import EngineConfig
from aioserve.runners.cpu.row_padding import RowPadding, probe_row_padding
from aioserve.runners.worker.torch_runner import TorchRunner

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


@pytest.mark.parametrize("forward", ["transformers", "lean-llama"])
def test_decode_logits_alone_equal_logits_in_every_batch_size(model_dir, forward):
    """Contexts of 5-99 tokens, so a sequence alone attends one to seven blocks and in
    a batch as many as its longest batch-mate."""
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
    differing = {size: [i for i, ok in enumerate(rows) if not ok]
                 for size, rows in same.items() if not all(rows)}
    assert not differing, differing


def test_prompt_logits_alone_equal_logits_beside_other_prompts(model_dir):
    """Prefill steps of 1-8 prompts (5-59 tokens each): each prompt's last logits are the
    same bits alone and packed with the others."""
    runner = TorchRunner(EngineConfig(model=model_dir, num_kv_blocks=128, device="cpu"))
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
        differing = runner._executor.submit(run).result()
    finally:
        runner.close()
    assert not any(differing.values()), differing
