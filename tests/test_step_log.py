"""The step log (``aioserve serve --step-log``): a served engine's steps written as JSON lines,
read back exactly, and fitted into a profile by ``aioserve calibrate
--from-steps``; a bad log is refused naming its line and field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

import aiohttp
import pytest
from scripted_runner import ScriptedRunner
from server_support import base_url, serve

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.engine.step_log import StepLog, read_step_log
from aioserve.scheduling import StepFeedback
from aioserve.server import ServerConfig
from aioserve.sim.step_cost import StepCostModel, feedback_features

STEP = StepFeedback(7, 10.0, 10.0025, ("a", "b"), (12, 1), (0, 40), (1, 1), (False, True), ("b",))


def scripted_engine() -> AsyncEngine:
    return AsyncEngine(EngineConfig(model="m", max_num_seqs=8), runner=ScriptedRunner([5]))


async def tokens(engine: AsyncEngine) -> list[int]:
    return [t async for out in engine.generate([7, 8], SamplingParams(max_tokens=2))
            for t in out.token_ids]


async def test_steps_are_read_back_as_they_were_written(tmp_path):
    async with scripted_engine() as engine:
        log = StepLog(engine, tmp_path / "steps.jsonl")
        log.attach()
        log.write(STEP)
        log.write(StepFeedback(8, 10.0025, 10.004, ("a",), (1,), (12,), (1,), (True,), ()))
        log.detach()
        assert await tokens(engine) == [5, 5]  # detached: not logged
    described, steps = read_step_log(tmp_path / "steps.jsonl")
    assert described["model"] == "m" and described["slots"] == 8
    assert len(steps) == 2 and steps[0] == STEP
    assert steps[1].request_ids == ("a",) and steps[1].finished == ()


def line(**changes: object) -> str:
    """STEP as a log line, with ``changes``."""
    return json.dumps({**asdict(STEP), **changes})


@pytest.mark.parametrize(("lines", "reason"), [
    (['{"engine": {}}', "{", line()], "line 2: not JSON"),
    (['{"step": 1}'], "line 1: the first line must be"),
    (['{"engine": {}}', '{"step": 1, "start_time": 0.0}'], "line 2: no field 'end_time'"),
    (['{"engine": {}}', line(request_ids=5)],
     "line 2: field 'request_ids' must be a list of strings, got 5"),
    (['{"engine": {}}', line(num_computed_tokens=[12, "x"])],
     "line 2: field 'num_computed_tokens' must be a list of integers >= 0"),
    (['{"engine": {}}', line(is_decode=[0, 1])], "field 'is_decode' must be a list of true"),
    (['{"engine": {}}', line(end_time="soon")], "field 'end_time' must be a number"),
    (['{"engine": {}}', line(start_positions=[0])],
     "line 2: one entry a row in each of request_ids, .* got 2, 2, 1, 2, 2"),
    ([], "empty"),
])
def test_a_bad_step_log_is_named_by_line_and_field(tmp_path, lines, reason):
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=reason):
        read_step_log(path)


def test_a_last_line_cut_short_is_dropped_and_one_in_the_middle_is_not(tmp_path):
    """A server stopped while writing leaves its last line unfinished (no newline)."""
    path = tmp_path / "steps.jsonl"
    whole = '{"engine": {}}\n' + line() + "\n"
    path.write_text(whole + line()[:40])
    assert read_step_log(path)[1] == [STEP]
    path.write_text(whole + line()[:40] + "\n" + line() + "\n")
    with pytest.raises(ValueError, match="line 3: not JSON"):
        read_step_log(path)


async def test_a_served_engine_logs_its_steps_and_they_fit_a_profile(model_dir, tmp_path):
    path = tmp_path / "steps.jsonl"
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=4, num_kv_blocks=64))
    async with serve(engine, ServerConfig(step_log=str(path))) as server, \
            aiohttp.ClientSession() as session:
        for prompt in ("Once upon a time", "The cat sat"):
            async with session.post(f"{base_url(server)}/v1/completions", json={
                    "prompt": prompt, "max_tokens": 12, "ignore_eos": True}) as response:
                assert response.status == 200
        while_serving = read_step_log(path)[1]  # line buffered: readable as it runs
        assert len(while_serving) >= 2 * 12
    described, steps = read_step_log(path)
    assert described["slots"] == 4 and described["kv_blocks"] == 64
    assert sum(sum(s.num_emitted_tokens) for s in steps) == 2 * 12
    assert all(s.end_time >= s.start_time for s in steps)
    assert [s.step for s in steps] == sorted(s.step for s in steps)
    profile = tmp_path / "profile.json"
    result = subprocess.run([sys.executable, "-m", "aioserve.cli", "calibrate",
                             "--from-steps", str(path), "--profile-out", str(profile)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    refused = subprocess.run([sys.executable, "-m", "aioserve.cli", "calibrate",
                              "--from-steps", str(path), "--profile-out",
                              str(tmp_path / "no" / "profile.json")],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--profile-out: no directory" in refused.stderr
    model = StepCostModel.load(profile)
    assert model.fit["steps"] == len(steps)  # every served step, none lost on the way
    assert model.cost_ms(*feedback_features(steps[-1])) > 0
    assert model.source["step_log"] == str(path) and model.source["slots"] == 4


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
async def test_a_log_that_cannot_be_written_stops_logging_not_the_engine(tmp_path, caplog):
    """/dev/full fails every write (ENOSPC): the step is dropped with one warning."""
    async with scripted_engine() as engine:
        log = StepLog(engine, "/dev/full")
        log.attach()  # line buffered: the header fails at once
        log.write(STEP)
        assert await tokens(engine) == [5, 5]  # served, its steps dropped
        log.detach()
    assert log._file is not None and log._file.closed
    assert sum("cannot write" in r.message for r in caplog.records) == 1
