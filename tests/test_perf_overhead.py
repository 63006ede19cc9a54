"""The engine-overhead benchmark runs (figures are reported, never asserted)."""

from __future__ import annotations

import json

import pytest

from aioserve.bench.overhead import NullRunner, measure_overhead
from aioserve.cli import main


async def test_overhead_benchmark_measures_every_part(tokenizer):
    result = await measure_overhead(64, 20, tokenizer=tokenizer)
    assert result.num_requests == 64 and result.num_steps == 20
    assert result.step_us > 0 and min(result.schedule_us, result.update_us, result.fan_out_us) > 0
    assert result.loop_us == pytest.approx(
        result.schedule_us + result.update_us + result.fan_out_us)
    assert result.other_us == pytest.approx(result.step_us - result.loop_us)
    assert "us/step" in result.summary() and "loop" in result.summary()


def test_overhead_cli_json(capsys):
    assert main(["bench", "overhead", "--num-requests", "16", "--num-steps", "10",
                 "--runs", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["median"]["num_requests"] == 16


async def test_null_runner_samples_only_where_asked():
    from aioserve.runners.base import ScheduledBatch
    batch = ScheduledBatch(["a", "b"], [2, 1], [0, 5], [False, True], [0, 0])
    assert (await NullRunner(token_id=7).step(batch)).token_ids == [-1, 7]
