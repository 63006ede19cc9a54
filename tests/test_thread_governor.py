"""Issue 26, item 1 and issue 34, item 6: the thread governor's decisions on synthetic
load windows, with hysteresis (a flickering load does not flip it), and the numbers its
log line gives.

A window says, over its wall time: the process's CPU time, the usable CPUs' idle time,
and how long the runner's worker ran and waited on a run queue. Two usable CPUs unless
said otherwise; no timing is measured here."""

from __future__ import annotations

import logging
import os
import re

import pytest

from aioserve.runners.cpu.threads.cpu_budget import affinity_cpus
from aioserve.runners.cpu.threads.cpu_load import LoadMeter, LoadReading, LoadWindow
from aioserve.runners.cpu.threads.thread_governor import ThreadGovernor


def window(own: float, idle: float, waited: float = 0.0, wall: float = 0.1,
           cpus: int = 2, runnable: float = 1.0) -> LoadWindow:
    """``own``/``idle`` in CPUs (so x wall seconds); the worker runnable ``runnable`` of
    the window, waiting ``waited`` of that."""
    busy = runnable * wall
    return LoadWindow(wall, own * wall, idle * wall, busy * (1 - waited), busy * waited, cpus)


QUIET = window(own=2.0, idle=0.0, waited=0.08)  # our team keeps both CPUs
TWO_COTENANTS_AT_2 = window(own=1.0, idle=0.0, waited=0.5)  # 4 runnable on 2 CPUs
TWO_COTENANTS_AT_1 = window(own=0.67, idle=0.0, waited=0.33)
ONE_COTENANT_AT_2 = window(own=1.33, idle=0.0, waited=0.33)
ONE_COTENANT_AT_1 = window(own=1.05, idle=0.0, waited=0.05)
LEFT_AT_1 = window(own=1.1, idle=0.9, waited=0.03)  # the co-tenants are gone


def test_a_quiet_machine_keeps_every_thread():
    governor = ThreadGovernor([1, 2])
    for _ in range(100):
        assert governor.decide(QUIET) == 2
    # our own event loop taking turns with the team is not a co-tenant
    for _ in range(100):
        assert governor.decide(window(own=2.0, idle=0.0, waited=0.3)) == 2
    assert governor.moves == 0


def run(governor: ThreadGovernor, windows: list[LoadWindow]) -> list[int]:
    """The count after each window, in order."""
    return [governor.decide(w) for w in windows]


MESSAGE = re.compile(r"other processes used (\d+\.\d\d) of (\d+) CPUs over (\d+\.\d) s, "
                     r"leaving (\d+\.\d\d); (\d+) threads need (\d+\.\d\d)")


def numbers(reason: str) -> tuple[float, int, float, float, int, float]:
    match = MESSAGE.match(reason)
    assert match, reason
    used, cpus, seconds, free, threads, need = match.groups()
    return float(used), int(cpus), float(seconds), float(free), int(threads), float(need)


def test_a_sustained_load_moves_the_team_once_and_says_why(caplog):
    governor = ThreadGovernor([1, 2])
    caplog.set_level(logging.INFO, logger="aioserve.threads")
    counts = run(governor, [TWO_COTENANTS_AT_2] * 30 + [TWO_COTENANTS_AT_1] * 50)
    assert counts[:4] == [2] * 4 and set(counts[4:]) == {1}  # after DOWN_HOLD_S (0.5 s)
    assert governor.moves == 1
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("CPU threads 2 -> 1: other processes used 1.00 of 2 CPUs over "
                           "0.5 s, leaving 1.00; 2 threads need 1.50 and would wait on them "
                           "(the runner waited 50% of its runnable time)"), line
    used, cpus, _, free, threads, need = numbers(line.split(": ", 1)[1])
    assert used + free == pytest.approx(cpus) and free < need == threads - 0.5
    # the co-tenants leave: back to 2 after UP_HOLD_S (1 s), once
    counts = run(governor, [LEFT_AT_1] * 40)
    assert counts[:9] == [1] * 9 and set(counts[9:]) == {2} and governor.moves == 2
    used, cpus, seconds, free, threads, need = numbers(governor.reason)
    assert (threads, need, seconds) == (2, 1.75, 1.0)
    assert used + free == pytest.approx(cpus) and free >= need


def test_a_flickering_load_does_not_flip_the_team():
    governor = ThreadGovernor([1, 2])
    # the benchmark client: loaded and quiet windows in turn, runs of up to 4
    pattern = [TWO_COTENANTS_AT_2] * 4 + [QUIET] + [ONE_COTENANT_AT_2] * 2 + [QUIET] * 3
    assert set(run(governor, pattern * 30)) == {2} and governor.moves == 0
    # and at one thread, the co-tenants leaving for less than the up hold
    run(governor, [TWO_COTENANTS_AT_2] * 5)
    pattern = [LEFT_AT_1] * 9 + [TWO_COTENANTS_AT_1] * 2
    assert set(run(governor, pattern * 30)) == {1} and governor.moves == 1


def test_a_load_in_the_band_between_the_margins_keeps_either_count():
    # 1.6 free CPUs: too few to go up to two threads, enough to stay at two
    band = window(own=1.6, idle=0.0, waited=0.3)
    governor = ThreadGovernor([1, 2])
    assert set(run(governor, [band] * 100)) == {2}
    run(governor, [TWO_COTENANTS_AT_2] * 5)
    assert set(run(governor, [window(own=1.0, idle=0.6, waited=0.05)] * 100)) == {1}
    assert governor.moves == 1


def test_a_load_that_comes_and_goes_every_second_settles():
    governor = ThreadGovernor([1, 2])
    second = [TWO_COTENANTS_AT_2] * 10 + [LEFT_AT_1] * 10
    counts = run(governor, second * 6)  # 12 s
    # down, up, down again (a flap: the up hold doubles past the quiet spells), then still
    assert governor.moves == 3 and set(counts[-50:]) == {1}


def test_moves_keep_their_distance():
    governor = ThreadGovernor([1, 4, 8])
    cpus8 = dict(cpus=8)
    run(governor, [window(own=5.3, idle=0.0, waited=0.33, **cpus8)] * 5)
    assert governor.threads == 4
    heavier = window(own=1.0, idle=0.0, waited=0.8, **cpus8)
    counts = run(governor, [heavier] * 30)
    # MIN_MOVE_GAP_S (2 s) after the first move, though 0.5 s called for it
    assert counts.index(1) == 19 and governor.moves == 2


def test_one_co_tenant_on_two_cpus_leaves_one_thread_and_no_flapping():
    governor = ThreadGovernor([1, 2])
    assert run(governor, [ONE_COTENANT_AT_2] * 5)[-1] == 1
    assert all(governor.decide(ONE_COTENANT_AT_1) == 1 for _ in range(200))


def test_a_window_over_an_idle_engine_measures_the_others_alone():
    governor = ThreadGovernor([1, 2])
    run(governor, [TWO_COTENANTS_AT_2] * 5)
    assert governor.threads == 1
    # two seconds idle while the co-tenants ran: no CPU free, stays at 1
    assert governor.decide(window(own=0.01, idle=0.0, wall=2.0, runnable=0.0)) == 1
    # two seconds idle on a quiet machine: back to 2 at the first step
    assert governor.decide(window(own=0.01, idle=1.99, wall=2.0, runnable=0.0)) == 2
    # and down again at once when the co-tenants came back while it was idle
    assert governor.decide(window(own=0.01, idle=0.1, wall=2.0, runnable=0.0)) == 1
    assert "(measured while the engine was idle)" in governor.reason


def test_no_move_down_without_the_worker_waiting_or_computing():
    governor = ThreadGovernor([1, 2])
    # free CPUs are few but the worker did not wait: another process's burst we did not feel
    assert set(run(governor, [window(own=1.2, idle=0.0, waited=0.05)] * 20)) == {2}
    # the worker waited, but was hardly runnable (a hand-over, not a computing team)
    assert set(run(governor, [window(own=0.3, idle=0.0, waited=0.9, runnable=0.1)] * 20)) == {2}


def test_an_up_move_undone_at_once_doubles_the_hold_and_one_that_holds_resets_it():
    governor = ThreadGovernor([1, 2])
    run(governor, [TWO_COTENANTS_AT_2] * 5)
    hold = governor.up_hold_s
    run(governor, [LEFT_AT_1] * 20)  # MIN_MOVE_GAP_S after the move down
    assert governor.threads == 2
    run(governor, [ONE_COTENANT_AT_2] * 20)  # the CPUs taken again at once: a flap
    assert governor.threads == 1 and governor.up_hold_s == 2 * hold
    while governor.threads == 1:
        governor.decide(LEFT_AT_1)
    run(governor, [QUIET] * (int(4 * governor.up_hold_s / 0.1) + 1))
    assert governor.up_hold_s == hold


def test_only_the_allowed_counts_are_used():
    governor = ThreadGovernor([1, 4, 8])  # e.g. 2 changed the logits' bits
    cpus8 = dict(cpus=8)
    # four co-tenants on 8 CPUs: 12 runnable, ours get 8 x 8/12 = 5.3 CPUs -> 4, not 5
    assert run(governor, [window(own=5.3, idle=0.0, waited=0.33, **cpus8)] * 5)[-1] == 4
    assert run(governor, [window(own=1.0, idle=0.0, waited=0.8, **cpus8)] * 20)[-1] == 1
    with pytest.raises(ValueError):
        ThreadGovernor([])


class ScriptedMeter:
    """A meter whose readings advance by given windows (wall time from a fake clock)."""

    cpus = frozenset({0, 1})
    tick_s = 0.01

    def __init__(self) -> None:
        self.now = LoadReading(0.0, 0.0, 0.0, 0.0, 0.0)
        self.closed = False

    def advance(self, w: LoadWindow) -> None:
        r = self.now
        self.now = LoadReading(r.wall_s + w.wall_s, r.own_cpu_s + w.own_cpu_s,
                               r.idle_cpu_s + w.idle_cpu_s, r.thread_run_s + w.thread_run_s,
                               r.thread_wait_s + w.thread_wait_s)

    def read(self) -> LoadReading:
        return self.now

    def window(self, start: LoadReading, end: LoadReading) -> LoadWindow:
        return LoadMeter.window(self, start, end)  # type: ignore[arg-type]

    def close(self) -> None:
        self.closed = True


def test_tick_applies_a_new_count_through_set_threads_once_a_window_has_passed():
    meter, applied = ScriptedMeter(), []
    governor = ThreadGovernor([1, 2], meter, applied.append, clock=lambda: meter.now.wall_s)
    governor.tick()
    assert applied == []
    meter.advance(window(own=1.0, idle=0.0, waited=0.5, wall=0.05))
    governor.tick()  # half a window: nothing decided yet
    assert applied == [] and governor.threads == 2
    for _ in range(4):  # windows of 0.16, 0.11, 0.11, 0.11 s: under DOWN_HOLD_S
        meter.advance(window(own=1.0, idle=0.0, waited=0.5, wall=0.11))
        governor.tick()
    assert applied == []
    meter.advance(window(own=1.0, idle=0.0, waited=0.5, wall=0.11))
    governor.tick()
    assert applied == [1] and governor.threads == 1
    governor.close()
    assert meter.closed


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux /proc")
def test_the_load_meter_reads_this_machine():
    meter = LoadMeter(affinity_cpus())
    try:
        first = meter.read()
        sum(i * i for i in range(200_000))  # some CPU time for this thread
        w = meter.window(first, meter.read())
    finally:
        meter.close()
    assert w.wall_s > 0 and w.own_cpu_s > 0 and w.thread_run_s > 0
    assert w.idle_cpu_s >= 0 and w.thread_wait_s >= 0 and w.num_cpus == len(affinity_cpus())
