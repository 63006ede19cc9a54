"""``serve``'s admission limit is on by default (``DEFAULT_WAITING_BATCHES`` batches of
``--max-num-seqs`` may wait; ``--max-waiting none`` turns it off), and a live server's 429
counts as refused, not as an error, in ``capacity --url``'s sweep."""

from __future__ import annotations

import asyncio

import pytest
from cli_support import refuse
from scripted_runner import GatedRunner, ScriptedRunner
from server_support import base_url, serve, wait_until

from aioserve import AsyncEngine, EngineConfig
from aioserve.bench.online.serving import http_refusal, run_serving
from aioserve.bench.online.sweep import live_sweep
from aioserve.cli import build_parser
from aioserve.commands.common import engine_config
from aioserve.commands.serve import admission_config
from aioserve.engine.admission import DEFAULT_WAITING_BATCHES
from aioserve.reports.figures import admission_refusals
from aioserve.reports.sweep import format_sweep
from aioserve.workloads.request import WorkloadRequest


def serve_limit(*options: str) -> int | None:
    args = build_parser().parse_args(["serve", "--model", "m", *options])
    return admission_config(engine_config(args), args).max_waiting


def test_serve_bounds_the_waiting_queue_by_default_in_batches():
    assert serve_limit() == DEFAULT_WAITING_BATCHES * 32
    assert serve_limit("--max-num-seqs", "4") == DEFAULT_WAITING_BATCHES * 4
    assert serve_limit("--max-waiting", "5") == 5
    assert serve_limit("--max-waiting", "none") is None
    assert serve_limit("--max-waiting", "None") is None
    # the engine itself (embedded, offline) keeps no limit unless given one
    assert EngineConfig(model="m").max_waiting is None


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_limit_names_the_flag_and_the_way_off(model_dir, value):
    line = refuse("serve", "--model", model_dir, "--max-waiting", value)
    assert "--max-waiting" in line and "'none'" in line, line


def test_a_429_of_the_limit_reads_as_a_refusal():
    body = '{"error": {"message": "at capacity", "type": "rate_limit_error", "code": "%s"}}'
    assert http_refusal(429, body % "queue_full") == "queue_full: at capacity (HTTP 429)"
    assert http_refusal(429, body % "queue_timeout").startswith("queue_timeout: ")
    assert http_refusal(429, body % "rate_limited") is None  # not this server's limit
    assert http_refusal(429, "Too Many Requests") is None
    assert http_refusal(503, body % "queue_full") is None


async def test_the_live_sweep_counts_429_as_refused_not_as_errors(tokenizer, tmp_path):
    count = 6
    trace = tmp_path / "burst.csv"  # none finishes before the gate opens: 1 runs, 1 waits
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{i},4,3\n" for i in range(count)))
    runner = GatedRunner([300, 301, 302])
    engine = AsyncEngine(EngineConfig(model="scripted", max_num_seqs=1, max_waiting=1),
                         runner=runner, tokenizer=tokenizer)
    async with serve(engine) as server:
        sweep = asyncio.create_task(live_sweep(
            base_url(server), str(trace), [10.0], 1, vocab_size=512, slo_ttft_ms=1e9,
            slo_tpot_ms=1e9, endpoint="completions"))
        stats = engine.stats
        await wait_until(lambda: stats()["num_running"] + stats()["num_waiting"]
                         + engine.core.admission.refused["queue_full"] == count)
        runner.gate.set()
        curve, _ = await sweep
    point = curve.runs[0][0]
    refused = engine.core.admission.refused["queue_full"]
    assert refused >= count - 2 and (point.requests, point.refused, point.errors) == (
        count, refused, 0)
    text = format_sweep([curve], 0.9)
    assert f"refused by the admission limit (queue_full, queue_timeout): " \
           f"{refused / count:.0%} ({refused} of {count})" in text, text
    assert "errors" not in text, text


async def test_the_start_up_summary_states_the_limit(tokenizer):
    from aioserve.server.operator_log import startup_summary

    args = build_parser().parse_args(["serve", "--model", "scripted", "--max-num-seqs", "2"])
    config = admission_config(engine_config(args), args)
    async with AsyncEngine(config, runner=ScriptedRunner([300]), tokenizer=tokenizer) as engine:
        summary = startup_summary(engine)
    assert (f"429 past {DEFAULT_WAITING_BATCHES * 2} waiting (--max-waiting), queue time "
            "limit none") in summary, summary


async def test_a_stream_ended_by_the_queue_time_limit_reads_as_refused(tokenizer):
    """A streamed request's 200 goes out before it is scheduled, so ``--max-queue-time-s``
    ends it with an error event: the client counts it as refused, not as an error."""
    runner = GatedRunner([300, 301, 302])
    engine = AsyncEngine(EngineConfig(model="scripted", max_num_seqs=1, max_queue_time_s=5),
                         runner=runner, tokenizer=tokenizer)
    requests = [WorkloadRequest(f"r{i}", 0.0, 4, 3) for i in range(2)]
    async with serve(engine) as server:
        replay = asyncio.create_task(run_serving(base_url(server), requests,
                                                 endpoint="completions"))
        await wait_until(lambda: engine.stats()["num_running"] == 1
                         and engine.stats()["num_waiting"] == 1)
        runner.now = 6.0  # the waiting one has waited past max_queue_time_s
        runner.gate.set()
        outcomes, _, _ = await replay
    assert sorted(o.ok for o in outcomes) == [False, True]
    (ended,) = [o for o in outcomes if not o.ok]
    assert ended.error is not None and ended.error.startswith("queue_timeout: "), ended.error
    assert admission_refusals(outcomes) == 1
