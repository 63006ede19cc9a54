"""Issue 13: ``aioserve simulate --html`` writes the dashboard's replay of simulated
runs: one self-contained page, frames per policy, consistent with the simulation."""

from __future__ import annotations

import json

from aioserve.cli import main
from aioserve.reports.replay import FrameRecorder
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.scenarios import load_workload


def embedded_runs(page: str) -> dict:
    start = page.index("AIOSERVE.replay(") + len("AIOSERVE.replay(")
    return json.loads(page[start:page.index(");\n", start)])


def test_simulate_html_writes_a_replay_per_policy(tmp_path, capsys):
    path = tmp_path / "report.html"
    argv = ["simulate", "--scheduler", "fcfs,spf", "--workload", "article-mix",
            "--kv-blocks", "12", "--html", str(path)]
    assert main(argv) == 0
    assert f"html: {path}" in capsys.readouterr().err
    page = path.read_text()
    assert "<script src" not in page and "AIOSERVE.replay(" in page  # self-contained
    runs = embedded_runs(page)
    assert list(runs) == ["fcfs", "spf"]
    for name, frames in runs.items():
        assert frames and all(f["scheduler"] == name and len(f["slots"]) == 4 for f in frames)
        assert [f["step"] for f in frames] == list(range(1, len(frames) + 1))
        assert all(a["time"] < b["time"] for a, b in zip(frames, frames[1:]))
        last = frames[-1]
        assert last["slots"] == [None] * 4 and last["num_waiting"] == 0
        assert last["ttft"]["p50"] > 0 and last["kv_used_blocks"] == 0


async def test_recorded_frames_agree_with_the_simulation():
    workload = load_workload("article-mix")
    recorder = FrameRecorder("test")
    result = await simulate(workload, "fcfs", SimConfig(kv_blocks=12), listener=recorder)
    frames = recorder.frames
    assert len(frames) == len(result.steps)
    ended = {rid: r.metrics.finished_step for rid, r in result.finished.items()}
    for frame, step in zip(frames, result.steps):
        shown = {s[0] for s in frame["slots"] if s is not None}
        still_running = {r for r in step.request_ids if ended[r] > frame["step"]}
        assert shown == still_running
    produced = sum(r.num_output_tokens for r in result.finished.values())
    assert frames[-1]["num_generated_tokens"] == produced
    assert frames[-1]["num_preemptions"] == result.preemptions


def test_long_runs_are_thinned_keeping_the_last_frame():
    recorder = FrameRecorder("test")
    recorder.frames = [{"step": i} for i in range(10_001)]
    kept = recorder.kept(limit=1000)
    assert len(kept) <= 1001 and kept[-1] == {"step": 10_000} and kept[0] == {"step": 0}
