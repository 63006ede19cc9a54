"""Issue 26, item 1: the thread governor's decisions on synthetic load windows.

A window says, over its wall time: the process's CPU time, the usable CPUs' idle time,
and how long the runner's worker ran and waited on a run queue. Two usable CPUs unless
said otherwise; no timing is measured here."""

from __future__ import annotations

import os

import pytest

from aioserve.runners.cpu.threads.cpu_budget import affinity_cpus
from aioserve.runners.cpu.threads.cpu_load import LoadMeter, LoadReading, LoadWindow
from aioserve.runners.cpu.threads.thread_governor import ThreadGovernor, threads_in_use


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


def test_co_tenants_take_the_cpus_and_the_team_shrinks_then_grows_back():
    governor = ThreadGovernor([1, 2])
    assert governor.decide(TWO_COTENANTS_AT_2) == 1
    assert "leave 1.0 of 2 CPUs" in governor.reason
    for _ in range(50):
        assert governor.decide(TWO_COTENANTS_AT_1) == 1
    decisions = [governor.decide(LEFT_AT_1) for _ in range(3)]
    assert decisions == [1, 1, 2]  # after UP_HOLD_S (0.3 s) of evidence
    assert "free for" in governor.reason and governor.moves == 2


def test_one_co_tenant_on_two_cpus_leaves_one_thread_and_no_flapping():
    governor = ThreadGovernor([1, 2])
    assert governor.decide(ONE_COTENANT_AT_2) == 1
    assert all(governor.decide(ONE_COTENANT_AT_1) == 1 for _ in range(200))


def test_a_window_over_an_idle_engine_measures_the_others_alone():
    governor = ThreadGovernor([1, 2])
    governor.decide(TWO_COTENANTS_AT_2)
    # two seconds idle while the co-tenants ran: no CPU free, stays at 1
    assert governor.decide(window(own=0.01, idle=0.0, wall=2.0, runnable=0.0)) == 1
    # two seconds idle on a quiet machine: back to 2 at the first step
    assert governor.decide(window(own=0.01, idle=1.99, wall=2.0, runnable=0.0)) == 2
    # and down again at once when the co-tenants came back while it was idle
    assert governor.decide(window(own=0.01, idle=0.1, wall=1.0, runnable=0.0)) == 1


def test_no_move_down_without_the_worker_waiting_or_computing():
    governor = ThreadGovernor([1, 2])
    # free CPUs are few but the worker did not wait: another process's burst we did not feel
    assert governor.decide(window(own=1.2, idle=0.0, waited=0.05)) == 2
    # the worker waited, but was hardly runnable (a hand-over, not a computing team)
    assert governor.decide(window(own=0.3, idle=0.0, waited=0.9, runnable=0.1)) == 2


def test_an_up_move_undone_at_once_doubles_the_hold_and_one_that_holds_resets_it():
    governor = ThreadGovernor([1, 2])
    governor.decide(TWO_COTENANTS_AT_2)
    hold = governor.up_hold_s
    for _ in range(3):
        governor.decide(LEFT_AT_1)
    assert governor.threads == 2
    governor.decide(ONE_COTENANT_AT_2)  # the CPUs were taken again at once: a flap
    assert governor.threads == 1 and governor.up_hold_s == 2 * hold
    while governor.threads == 1:
        governor.decide(LEFT_AT_1)
    for _ in range(int(4 * governor.up_hold_s / 0.1) + 1):
        governor.decide(QUIET)
    assert governor.up_hold_s == hold


def test_only_the_allowed_counts_are_used():
    governor = ThreadGovernor([1, 4, 8])  # e.g. 2 changed the logits' bits
    cpus8 = dict(cpus=8)
    # four co-tenants on 8 CPUs: 12 runnable, ours get 8 x 8/12 = 5.3 CPUs -> 4, not 5
    assert governor.decide(window(own=5.3, idle=0.0, waited=0.33, **cpus8)) == 4
    assert governor.decide(window(own=1.0, idle=0.0, waited=0.8, **cpus8)) == 1
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
    meter.advance(window(own=1.0, idle=0.0, waited=0.5, wall=0.06))
    governor.tick()
    assert applied == [1] and threads_in_use(type("R", (), {"governor": governor})()) == 1
    governor.close()
    assert meter.closed


def test_threads_in_use_reads_a_fixed_count_or_nothing():
    assert threads_in_use(type("R", (), {"num_threads": 3})()) == 3
    assert threads_in_use(object()) is None


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
