"""The article's tables ("continuous batching: a car-pool whose empty seats are refilled
at every stop", 4 slots, 50 ms per step), reproduced exactly by the simulator."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from aioserve import cli
from aioserve.commands import simulate as simulate_command
from aioserve.reports.report import summarize
from aioserve.sim.simulator import simulate
from aioserve.workloads.request import article_example, article_mix


def run_simulate(argv: list[str]) -> int:
    """``aioserve simulate ARGV`` through the command module alone (so a broken sibling
    command cannot hide a failure here); ``test_cli_wiring`` checks the real CLI."""
    parser = argparse.ArgumentParser()
    simulate_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["simulate", *argv])
    try:
        return simulate_command.run(args)
    except ValueError as exc:
        print(f"aioserve: error: {exc}", file=sys.stderr)
        return 2


def latencies(summary):
    return {r["id"]: r["latency_s"] for r in summary["requests"]}


async def test_static_example_matches_the_article():
    summary = summarize(await simulate(article_example(), "static"))
    assert latencies(summary) == {"A": 5.0, "B": 1.0, "C": 2.5, "D": 10.0, "E": 11.5}
    assert summary["mean_latency_s"] == 6.0


async def test_fcfs_example_refills_the_seat_b_leaves():
    summary = summarize(await simulate(article_example(), "fcfs"))
    assert latencies(summary) == {"A": 5.0, "B": 1.0, "C": 2.5, "D": 10.0, "E": 2.5}
    assert summary["mean_latency_s"] == 4.2
    e = next(r for r in summary["requests"] if r["id"] == "E")
    assert e["first_token_s"] == 1.05  # B's seat, refilled at the 1.0 s stop
    assert summary["preemptions"] == 0


async def test_article_mix_static_and_fcfs():
    static = summarize(await simulate(article_mix(), "static"))
    assert (static["makespan_s"], static["throughput_tok_s"]) == (250.0, 44.0)
    fcfs = await simulate(article_mix(), "fcfs")
    summary = summarize(fcfs)
    assert summary["makespan_s"] == 142.0
    assert round(summary["throughput_tok_s"], 2) == 77.46
    assert len(fcfs.steps) == 2840
    # the 90 steps beyond the article's ideal 2,750 are all seats left empty at the end
    last_admission = max(r.metrics.first_scheduled_time for r in fcfs.finished.values())
    empty = [(s.start_s >= last_admission, 4 - len(s.request_ids)) for s in fcfs.steps]
    assert sum(n for late, n in empty if not late) == 0
    assert sum(n for late, n in empty if late) == 360


def test_cli_prints_article_figures(capsys):
    assert run_simulate(["--workload", "article-example", "--scheduler", "static"]) == 0
    out = capsys.readouterr().out
    assert "mean latency 6.000 s (article: 6.0 s)" in out
    assert run_simulate(["--workload", "article-mix", "--scheduler", "static,fcfs"]) == 0
    out = capsys.readouterr().out
    assert "makespan 250.0 s = 44.00 tok/s" in out
    assert "makespan 142.0 s = 77.46 tok/s" in out
    assert "(article: 137.5 s = 80 tok/s)" in out and "idealised" in out


def test_cli_json_last_line(capsys):
    argv = ["--workload", "article-example", "--scheduler", "fcfs", "--json"]
    assert run_simulate(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    keys = {
        "scheduler",
        "slots",
        "makespan_s",
        "throughput_tok_s",
        "mean_latency_s",
        "p50_latency_s",
        "p99_latency_s",
        "mean_ttft_s",
        "preemptions",
        "requests",
    }
    assert keys <= summary.keys()
    assert (summary["scheduler"], summary["slots"], summary["mean_latency_s"]) == ("fcfs", 4, 4.2)
    row = summary["requests"][4]
    assert row == row | {
        "id": "E",
        "status": "finished",
        "arrival_s": 0.0,
        "first_token_s": 1.05,
        "finish_s": 2.5,
        "latency_s": 2.5,
        "output_tokens": 30,
    }
    assert summary["p50_latency_s"] == 2.5 and summary["p99_latency_s"] == pytest.approx(9.8)
    assert summary["mean_ttft_s"] == pytest.approx((0.05 * 4 + 1.05) / 5)


def test_cli_rejects_what_never_fits_and_plots(tmp_path, capsys):
    lines = [
        {"id": "ok", "arrival_s": 0.0, "prompt_len": 8, "output_len": 20},
        {"id": "huge", "arrival_s": 0.1, "prompt_len": 60, "output_len": 10},
        {"id": "late", "arrival_s": 5.0, "prompt_len": 4, "output_len": 3},
    ]
    workload = tmp_path / "w.jsonl"
    workload.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    plot = tmp_path / "cmp.png"
    argv = [
        "--workload",
        str(workload),
        "--scheduler",
        "static,spf",
        "--kv-blocks",
        "8",
        "--block-size",
        "4",
        "--json",
        "--plot",
        str(plot),
    ]
    assert run_simulate(argv) == 0
    runs = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()[-2:]]
    assert [r["scheduler"] for r in runs] == ["static", "spf"]
    for run in runs:
        status = {r["id"]: (r["status"], r["output_tokens"]) for r in run["requests"]}
        assert status == {"ok": ("finished", 20), "huge": ("rejected", 0), "late": ("finished", 3)}
        late = run["requests"][2]
        assert late["latency_s"] == pytest.approx(0.15)  # an idle engine starts at arrival
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_unknown_workload_is_an_error(capsys):
    assert run_simulate(["--workload", "nope"]) == 2
    assert "article-example" in capsys.readouterr().err


def test_cli_wiring(capsys):
    assert "aioserve.commands.simulate" in cli.COMMAND_MODULES
    assert cli.main(["simulate", "--workload", "article-example", "--scheduler", "fcfs"]) == 0
    assert "mean latency 4.200 s (article: 4.2 s)" in capsys.readouterr().out
