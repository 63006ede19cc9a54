"""The simulator enforces the engine's admission limit (``max_waiting``,
``max_queue_time_s``) with the engine core's own rule, and the reports count what it refused
by reason; ``aioserve simulate`` and ``aioserve capacity`` take the limits as serve does."""

from __future__ import annotations

import json

from aioserve.cli import main
from aioserve.reports.figures import outcomes, rejection_warning, rejections
from aioserve.reports.report import summarize
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest


def burst(n: int, output_len: int = 10) -> list[WorkloadRequest]:
    """``n`` requests arriving together at t=0 (an overload of one slot)."""
    return [WorkloadRequest(f"r{i}", 0.0, 4, output_len) for i in range(n)]


async def test_a_full_queue_refuses_the_overload_as_queue_full():
    """One slot, at most 3 waiting: of 10 arriving together, the first 3 queue (the first is
    scheduled at the next step), the 7 others are refused at once."""
    result = await simulate(burst(10), "fcfs", SimConfig(slots=1, max_waiting=3))
    assert sorted(result.finished) == ["r0", "r1", "r2"]
    assert sorted(result.rejected) == [f"r{i}" for i in range(3, 10)]
    assert all(why.startswith("queue_full: ") and "max_waiting 3" in why
               for why in result.rejected.values())
    every = outcomes(result)
    assert rejections(every) == {"queue_full": 7}
    warning = rejection_warning("fcfs", every)
    assert warning is not None and "7 of 10 requests not served (7 queue_full)" in warning
    assert summarize(result)["rejected_by_reason"] == {"queue_full": 7}


async def test_without_a_limit_nothing_is_refused():
    result = await simulate(burst(10), "fcfs", SimConfig(slots=1))
    assert len(result.finished) == 10 and not result.rejected


async def test_a_request_waiting_too_long_is_refused_as_queue_timeout():
    """One slot, 50 ms steps, 10 tokens each (0.5 s a request): r1 starts at 0.5 s, within
    the 0.6 s allowed; r2 and r3 would start at 1.0 s and 1.5 s, so they are ended unscheduled."""
    result = await simulate(burst(4), "fcfs", SimConfig(slots=1, max_queue_time_s=0.6))
    assert sorted(result.finished) == ["r0", "r1"]
    assert sorted(result.rejected) == ["r2", "r3"]
    assert rejections(outcomes(result)) == {"queue_timeout": 2}
    assert all(o.first_token_s is None for o in outcomes(result) if o.error is not None)


def test_simulate_takes_the_limit_and_says_how_many_it_refused(capsys):
    status = main(["simulate", "--workload", "poisson:n=60,rate=40", "--slots", "1",
                   "--max-waiting", "2", "--json"])
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    refused = summary["rejected_by_reason"]["queue_full"]
    assert status == 0 and 0 < refused < 60
    assert f"({refused} queue_full)" in captured.err


def test_capacity_reports_what_the_limit_would_have_refused(capsys):
    status = main(["capacity", "--workload", "poisson:n=60", "--slots", "1",
                   "--sweep-rate", "1:20:2", "--sweep-repeats", "1", "--slo-ttft-ms", "5000",
                   "--max-waiting", "2", "--max-queue-time-s", "30", "--json"])
    out = capsys.readouterr().out
    text = " ".join(out.split())  # the notes are wrapped
    assert status == 0
    assert "fcfs: refused by the admission limit (queue_full, queue_timeout): " in text
    curve = json.loads(out.strip().splitlines()[-1])
    (low,), (high,) = curve["runs"]
    assert low["requests"] == high["requests"] == 60
    assert 0 < high["refused"] <= 60 and low["refused"] <= high["refused"]
    assert f"({high['refused']} of 60) at 20/s" in text
    assert "admission limit: max_waiting 2, max_queue_time_s 30 s" in text


def test_fewest_replicas_reports_what_the_limit_would_have_refused(capsys):
    """At 40 req/s one slot a replica cannot keep up: the limit refuses at the counts
    tried, and the search says how many, as the rate sweep does."""
    status = main(["capacity", "--workload", "poisson:n=60,rate=40", "--slots", "1",
                   "--fewest-replicas", "4", "--slo-ttft-ms", "5000", "--max-waiting", "2",
                   "--json"])
    out = capsys.readouterr().out
    assert status == 0 and "admission limit: max_waiting 2" in out
    search = json.loads(out.strip().splitlines()[-1])
    refused = {int(n): tried["refused"] for n, tried in search["tried"].items()}
    assert refused and all(0 <= n <= 60 for n in refused.values()) and any(refused.values())
    shares = ", ".join(f"{n / 60:.0%} ({n} of 60) at {count}"
                       for count, n in sorted(refused.items()))
    assert ("fcfs x round_robin: refused by the admission limit (queue_full, queue_timeout), "
            f"by replicas: {shares}") in out, out
