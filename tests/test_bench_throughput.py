"""``aioserve bench throughput`` end to end on a tiny workload (no timing assertions)."""

from __future__ import annotations

import json

import pytest

from aioserve.bench.workloads import parse_range, random_requests
from aioserve.cli import main


def test_throughput_json_with_hf_compare_and_exactness_check(model_dir, capsys):
    status = main([
        "bench", "throughput", "--model", model_dir, "--num-prompts", "6",
        "--input-len", "2:20", "--output-len", "3:12", "--max-num-seqs", "4",
        "--compare", "hf-static", "--hf-batch-size", "4", "--check", "--json",
    ])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    ours, theirs = report["median"]["aioserve"], report["median"]["hf-static"]
    assert ours["num_requests"] == theirs["num_requests"] == 6
    assert ours["output_tokens"] == theirs["output_tokens"]
    assert ours["output_tokens_per_s"] > 0 and theirs["total_tokens_per_s"] > 0
    assert report["ratio"] == pytest.approx(
        ours["output_tokens_per_s"] / theirs["output_tokens_per_s"])
    assert report["mismatches"] == 0  # every output equals its solo generate()


def test_throughput_human_output(model_dir, capsys):
    assert main(["bench", "throughput", "--model", model_dir, "--num-prompts", "3",
                 "--input-len", "4:8", "--output-len", "2:4", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "aioserve:" in out and "output tokens/s" in out


def test_workload_is_reproducible_and_in_range():
    a = random_requests(20, (8, 128), (16, 256), vocab_size=512, seed=3)
    assert a == random_requests(20, (8, 128), (16, 256), vocab_size=512, seed=3)
    for r in a:
        assert r.prompt_token_ids[0] == 1 and 8 <= r.prompt_len <= 128
        assert 16 <= r.output_len <= 256 and all(3 <= t < 512 for t in r.prompt_token_ids[1:])


@pytest.mark.parametrize("text", ["0:4", "5:3", "a:b", "1:2:3"])
def test_parse_range_rejects(text):
    with pytest.raises(ValueError):
        parse_range(text)


def test_parse_range_accepts():
    assert parse_range("8:128") == (8, 128) and parse_range("7") == (7, 7)
