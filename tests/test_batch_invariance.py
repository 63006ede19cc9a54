"""The batch-invariance policy has one switch: on (the default), row padding and the
32-key context floor are in force (the invariance tests in test_row_padding.py and
test_perf_exactness.py run under it); off, neither is: steps run at their own row
counts and groups span only their own contexts."""

from __future__ import annotations

import numpy as np
import torch

from aioserve.cli import build_parser
from aioserve.commands.common import engine_config
from aioserve.config import EngineConfig
from aioserve.runners.attention.reference import ReferenceBackend
from aioserve.runners.batch_invariance import MIN_CONTEXT_WIDTH, BatchInvariance
from aioserve.runners.cpu.row_padding import probe_row_padding
from aioserve.runners.torch.runner import TorchRunner


def test_the_switch_is_one_config_field_and_one_flag():
    assert EngineConfig(model="m").batch_invariant is True
    parser = build_parser()
    on = parser.parse_args(["serve", "--model", "m"])
    off = parser.parse_args(["serve", "--model", "m", "--no-batch-invariant"])
    assert engine_config(on).batch_invariant is True
    assert engine_config(off).batch_invariant is False


def test_policy_off_has_no_floor_and_no_padding():
    weights = [torch.randn(172, 64), torch.randn(64, 172), torch.randn(512, 64)]
    assert BatchInvariance(True).min_context_width == MIN_CONTEXT_WIDTH == 32
    assert BatchInvariance(False).min_context_width == 1
    off = BatchInvariance(False).row_padding(weights, torch.device("cpu"))
    assert not off.needed and all(off.padded(m) == m for m in range(200))
    on = BatchInvariance(True).row_padding(weights, torch.device("cpu"))
    assert on.targets == probe_row_padding(weights).targets
    assert not BatchInvariance(True).row_padding(weights, torch.device("cuda")).needed


def test_context_floor_follows_the_policy():
    cache = (torch.zeros(64 * 4, 2, 8), torch.zeros(64 * 4, 2, 8))
    widths = {}
    for enabled in (True, False):
        backend = ReferenceBackend(BatchInvariance(enabled))
        meta, _ = backend.build_metadata([cache], [2, 4], [1, 1], [[5], [6, 7]], 4,
                                         torch.device("cpu"), ())
        widths[enabled] = {int(g.gather_blocks.shape[1]) * 4 for g in meta.groups}
    assert widths == {True: {32}, False: {8}}  # off: the longest context, 5 keys -> 2 blocks


def test_runner_off_runs_steps_at_their_own_row_counts(model_dir, monkeypatch):
    rows_seen: dict[bool, list[int]] = {}
    for enabled in (True, False):
        runner = TorchRunner(EngineConfig(model=model_dir, num_kv_blocks=64, device="cpu",
                                          batch_invariant=enabled))
        seen = rows_seen[enabled] = []
        build = runner.backend.build_metadata

        def spy(caches, starts, *args, seen=seen, build=build):
            seen.append(len(starts))
            return build(caches, starts, *args)

        monkeypatch.setattr(runner.backend, "build_metadata", spy)
        assert runner.backend.min_context == (32 if enabled else 1)

        def steps(runner=runner) -> None:
            with torch.inference_mode():
                for rows in (1, 2, 3, 5):
                    tables = np.arange(rows, dtype=np.int64)[:, None] + 4
                    runner._run_model(torch.ones(rows, dtype=torch.int64),
                                      np.zeros(rows, np.int64), np.ones(rows, np.int64),
                                      tables, torch.arange(rows), None)

        try:
            runner._executor.submit(steps).result()
            expected = [runner.row_padding.padded(rows) for rows in (1, 2, 3, 5)]
        finally:
            runner.close()
        assert seen == expected
    assert rows_seen[False] == [1, 2, 3, 5]
