"""``aioserve bench throughput`` end to end on a tiny workload (no timing assertions)."""

from __future__ import annotations

import json

import pytest

from aioserve.cli import build_parser, main
from aioserve.commands.common import engine_config
from aioserve.workloads.synthetic import parse_range, prefix_repetition_requests, random_requests


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


def test_one_run_is_never_the_warm_up(model_dir, capsys):
    """With --runs 1 each side's warm-up pass is recorded apart from its one timed run."""
    assert main([
        "bench", "throughput", "--model", model_dir, "--num-prompts", "3",
        "--input-len", "2:8", "--output-len", "2:4", "--max-num-seqs", "2",
        "--compare", "hf-static", "--hf-batch-size", "2", "--runs", "1", "--json",
    ]) == 0
    report = json.loads(capsys.readouterr().out)
    for side in ("aioserve", "hf-static"):
        assert len(report["runs"][side]) == 1
        warmup, timed = report["warmups"][side], report["runs"][side][0]
        assert warmup["num_requests"] == timed["num_requests"] == 3
        assert warmup["elapsed_s"] != timed["elapsed_s"]  # two passes, not one counted twice
        assert report["median"][side] == timed


def test_throughput_human_output(model_dir, capsys):
    assert main(["bench", "throughput", "--model", model_dir, "--num-prompts", "3",
                 "--input-len", "4:8", "--output-len", "2:4", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "aioserve:" in out and "output tokens/s" in out
    assert out.count("(warm-up, not counted)") == 1


def test_workload_is_reproducible_and_in_range():
    a = random_requests(20, (8, 128), (16, 256), vocab_size=512, seed=3)
    assert a == random_requests(20, (8, 128), (16, 256), vocab_size=512, seed=3)
    for r in a:
        assert r.prompt_ids[0] == 1 and 8 <= r.prompt_len <= 128
        assert 16 <= r.output_len <= 256 and all(3 <= t < 512 for t in r.prompt_ids[1:])


@pytest.mark.parametrize("text", ["0:4", "5:3", "a:b", "1:2:3"])
def test_parse_range_rejects(text):
    with pytest.raises(ValueError):
        parse_range(text)


def test_parse_range_accepts():
    assert parse_range("8:128") == (8, 128) and parse_range("7") == (7, 7)


def test_prefix_repetition_compared_with_caching_off(model_dir, capsys):
    status = main([
        "bench", "throughput", "--model", model_dir, "--num-prompts", "6",
        "--dataset", "prefix-repetition", "--prefix-len", "40", "--suffix-len", "4",
        "--num-prefixes", "2", "--output-len", "2:4", "--max-num-seqs", "2",
        "--compare", "no-prefix-caching", "--json",
    ])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    on, off = report["median"]["aioserve"], report["median"]["no-caching"]
    assert report["baseline"] == "no-caching" and on["output_tokens"] == off["output_tokens"]
    assert off["prefix_hit_rate"] == 0 and on["prefix_hit_rate"] > 0
    assert on["mean_ttft_ms"] > 0 and off["mean_ttft_ms"] > 0


def test_prefix_repetition_workload_shares_prefixes():
    requests = prefix_repetition_requests(8, 20, 5, 2, (3, 3), vocab_size=512, seed=1)
    assert requests == prefix_repetition_requests(8, 20, 5, 2, (3, 3), vocab_size=512, seed=1)
    prefixes = {tuple(r.prompt_ids[:20]) for r in requests}
    assert len(prefixes) == 2 and all(r.prompt_len == 25 for r in requests)
    assert all(p[0] == 1 for p in prefixes)


@pytest.mark.parametrize("command", [["generate", "hi"], ["serve"]])
def test_prefix_caching_flag(command):
    parser = build_parser()
    assert parser.parse_args([*command, "--model", "m"]).enable_prefix_caching is True
    args = parser.parse_args([*command, "--model", "m", "--no-enable-prefix-caching"])
    assert engine_config(args).enable_prefix_caching is False
