"""Production traces as workloads (issue 32, item 1): formats told by columns, readers,
windows and scaling, Mooncake prefix blocks shared in the simulator, errors by file, line
and column, and the client's arrival options (burstiness, a concurrency limit)."""

from __future__ import annotations

import json
import math
from itertools import islice
from pathlib import Path

import pytest

from aioserve.bench.online.serving import arrival_gaps
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import FIRST_WORD_ID, WorkloadRequest
from aioserve.workloads.scenarios import load_workload
from aioserve.workloads.trace_formats import AZURE, AZURE_PROCESSED, MOONCAKE
from aioserve.workloads.trace_options import describe, load_file, parse_options
from aioserve.workloads.traces import detect

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
AZURE_TRACE = TRACES / "azure-llm-2023-conv.csv"
MOONCAKE_TRACE = TRACES / "mooncake-2025-conversation.jsonl"


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def mooncake_rows(rows: list[tuple[int, int, int, list[int]]]) -> list[str]:
    return [json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h})
            for t, i, o, h in rows]


def test_each_reader_on_a_small_file(tmp_path):
    processed = write(tmp_path / "p.csv", ["arrived_at,num_prefill_tokens,num_decode_tokens",
                                           "2.5,30,4", "1.0,10,0"])
    original = write(tmp_path / "o.csv", [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109"])
    moon = write(tmp_path / "m.jsonl", mooncake_rows([(0, 600, 5, [0, 1]), (1500, 100, 2, [0])]))
    assert [detect(p) for p in (processed, original, moon)] == [AZURE_PROCESSED, AZURE, MOONCAKE]
    rows = load_workload(str(processed))
    assert [(r.id, r.arrival_s, r.prompt_len, r.output_len) for r in rows] == [
        ("p-1", 0.0, 10, 1), ("p-0", 1.5, 30, 4)]  # arrival order; an output of 0 read as 1
    rows = load_workload(str(original))
    assert [r.arrival_s for r in rows] == [0.0, pytest.approx(4.314579)]
    assert [(r.prompt_len, r.output_len) for r in rows] == [(374, 44), (396, 109)]
    rows = load_workload(str(moon))
    assert [(r.arrival_s, r.prompt_len, r.prefix_blocks, r.block_tokens) for r in rows] == [
        (0.0, 600, (0, 1), 512), (1.5, 100, (0,), 512)]


def test_the_shipped_traces_first_lines_read(tmp_path):
    for trace, count in ((AZURE_TRACE, 40), (MOONCAKE_TRACE, 40)):
        with open(trace) as file:
            head = write(tmp_path / trace.name, [line.rstrip("\n") for line in islice(file, count)])
        rows = load_workload(f"{head}:n=20,max_len=512,len_scale=auto,rate=2")
        assert len(rows) == 20 and rows[0].arrival_s == 0
        assert all(r.prompt_len + r.output_len <= 512 for r in rows)
        assert (len(rows) - 1) / rows[-1].arrival_s == pytest.approx(2.0, rel=1e-3)


def test_window_by_start_duration_count_and_index(tmp_path):
    path = write(tmp_path / "t.csv", ["arrived_at,num_prefill_tokens,num_decode_tokens",
                                      *(f"{t},{10 + t},5" for t in range(10))])
    assert [r.id for r in load_file(path, "start=2,duration=3")] == ["t-2", "t-3", "t-4"]
    assert [r.id for r in load_file(path, "start=2,duration=3,window=1")] == ["t-5", "t-6", "t-7"]
    assert [r.id for r in load_file(path, "start=1,n=3,window=1")] == ["t-4", "t-5", "t-6"]
    with pytest.raises(ValueError, match="window 3 of 3 requests from 0.0 s: only 1 left"):
        load_file(path, "n=3,window=3")
    with pytest.raises(ValueError, match="holds no request"):
        load_file(path, "start=50,duration=5")


def test_time_scaling_rate_speed_and_burstiness(tmp_path):
    path = write(tmp_path / "t.csv", ["arrived_at,num_prefill_tokens,num_decode_tokens",
                                      *(f"{2 * t},10,5" for t in range(5))])
    assert [r.arrival_s for r in load_file(path, "rate=2")] == [0, 0.5, 1, 1.5, 2]
    assert [r.arrival_s for r in load_file(path, "speed=4")] == [0, 0.5, 1, 1.5, 2]
    bursty = load_file(path, "rate=3,burstiness=0.5,seed=1")
    assert [r.id for r in bursty] == [f"t-{i}" for i in range(5)]  # order kept
    assert bursty != load_file(path, "rate=3,burstiness=0.5,seed=2")
    gaps = arrival_gaps(4000, 10.0, 0, burstiness=0.25)
    mean = sum(gaps) / len(gaps)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
    assert mean == pytest.approx(0.1, rel=0.1) and cv == pytest.approx(2.0, rel=0.15)


def test_lengths_scale_by_one_factor_and_clip_to_the_context(tmp_path):
    path = write(tmp_path / "t.csv", ["arrived_at,num_prefill_tokens,num_decode_tokens",
                                      *(f"{t},{100 * (t + 1)},{10 * (t + 1)}" for t in range(100))])
    half = load_file(path, "len_scale=0.5")
    assert [(r.prompt_len, r.output_len) for r in half[:2]] == [(50, 5), (100, 10)]
    auto = load_file(path, "len_scale=auto,max_len=512")
    factor = 512 / (110 * 99)  # the p99 of prompt + output (row 99 of 100) becomes 512
    expected = [(round(100 * (t + 1) * factor), max(1, round(10 * (t + 1) * factor)))
                for t in range(100)]
    assert [(r.prompt_len, r.output_len) for r in auto[:99]] == expected[:99]
    assert (auto[99].prompt_len + auto[99].output_len, auto[99].output_len) == (512, 47)
    window = load_file(path, "len_scale=auto,max_len=512,start=10,n=5")
    assert [r.prompt_len for r in window] == [r.prompt_len for r in auto[10:15]]  # one factor
    clipped = load_file(path, "max_len=300")
    assert all(r.output_len <= 150 and r.prompt_len + r.output_len <= 300 for r in clipped)


async def test_mooncake_prefix_blocks_survive_scaling_in_the_simulator(tmp_path):
    rows = [(100 * i, 2048 + 37 * i, 20, [0, 1, 2, 10 + i, 20 + i]) for i in range(8)]
    path = write(tmp_path / "m.jsonl", mooncake_rows(rows))
    workload = load_workload(f"{path}:len_scale=1/32,max_len=512,speed=1")
    assert {r.block_tokens for r in workload} == {16}  # 512 x 1/32: one 16-token KV block
    first, second = (w.prompt_token_ids(512, FIRST_WORD_ID) for w in workload[:2])
    assert first[:48] == second[:48] and first[48:64] != second[48:64]  # ids 0,1,2 equal
    result = await simulate(workload, "fcfs", SimConfig(slots=2, enable_prefix_caching=True,
                                                        max_model_len=512))
    cached = [result.finished[w.id].num_cached_tokens for w in workload]
    assert cached[0] == 0 and all(c == 48 for c in cached[1:])


@pytest.mark.parametrize(("lines", "error"), [
    (["arrived_at,num_prefill_tokens,num_decode_tokens", "0,10,5", "1,x,5"],
     r"t\.csv:3: column 'num_prefill_tokens': expected a whole number of tokens >= 0, got 'x'"),
    (["arrived_at,num_prefill_tokens,num_decode_tokens", "0,10"],
     r"t\.csv:2: column 'num_decode_tokens' missing"),
    (["TIMESTAMP,ContextTokens,GeneratedTokens", "yesterday,1,2"],
     r"t\.csv:2: column 'TIMESTAMP': expected a time"),
])
def test_csv_errors_name_file_line_and_column(tmp_path, lines, error):
    with pytest.raises(ValueError, match=error):
        load_workload(str(write(tmp_path / "t.csv", lines)))


def test_jsonl_trace_errors_name_file_line_and_column(tmp_path):
    good = mooncake_rows([(0, 10, 2, [0])])[0]
    path = write(tmp_path / "m.jsonl", [good, json.dumps({"timestamp": 5, "input_length": 3,
                                                         "output_length": 1})])
    with pytest.raises(ValueError, match=r"m\.jsonl:2: column 'hash_ids' missing"):
        load_workload(str(path))
    path = write(tmp_path / "m.jsonl", [good, good.replace("[0]", '"a"')])
    with pytest.raises(ValueError, match=r"m\.jsonl:2: column 'hash_ids': expected a list"):
        load_workload(str(path))


@pytest.mark.parametrize(("text", "error"), [
    ("rate=2,speed=3", "rate and speed: give one"), ("bogus=1", "'bogus': unknown"),
    ("n=2.5", "n: expected a whole number"), ("len_scale=auto", "needs max_len"),
    ("rate=0", "rate: must be > 0"),
])
def test_options_are_checked_by_name(text, error):
    with pytest.raises(ValueError, match=error):
        parse_options(text)


def test_a_project_workload_file_takes_the_same_options(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"r{i}", "arrival_s": i, "prompt_len": 40,
                                          "output_len": 8}) for i in range(6)))
    rows = load_workload(f"{path}:start=1,n=3,len_scale=0.5,rate=4")
    assert [(r.id, r.arrival_s, r.prompt_len, r.output_len) for r in rows] == [
        ("r1", 0, 20, 4), ("r2", 0.25, 20, 4), ("r3", 0.5, 20, 4)]
    assert describe(rows) == ("3 requests over 0.5 s (4.00 req/s); prompt tokens median / p99 "
                              "/ max 20 / 20 / 20, output 4 / 4 / 4")


async def test_max_concurrency_holds_arrivals_and_counts_ttft_from_the_send():
    workload = [WorkloadRequest(f"r{i}", 0.0, 4, 10) for i in range(4)]
    limited = await simulate(workload, "fcfs", SimConfig(slots=4, max_concurrency=2))
    free = await simulate(workload, "fcfs", SimConfig(slots=4))
    assert max(len(s.request_ids) for s in limited.steps) == 2
    assert max(len(s.request_ids) for s in free.steps) == 4
    sent = sorted(w.arrival_s for w in limited.workload)
    assert sent == [0.0, 0.0, 0.5, 0.5]  # sent when the first two ended, after 10 steps


def test_the_shipped_traces_read_whole_as_their_readme_counts():
    azure, moon = load_workload(str(AZURE_TRACE)), load_workload(str(MOONCAKE_TRACE))
    assert (len(azure), len(moon)) == (19_366, 12_031)
    assert round(azure[-1].arrival_s) == 3502 and round(moon[-1].arrival_s) == 3537
    assert sorted(r.prompt_len for r in moon)[len(moon) // 2] == 6909
    window = load_workload(f"{MOONCAKE_TRACE}:start=1800,n=50,len_scale=1/32,max_len=512")
    assert len(window) == 50 and {r.block_tokens for r in window} == {16}
