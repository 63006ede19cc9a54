"""LoadMeter: what the CPUs did between two readings, from ``/proc`` (Linux).

Three counters, each cheap to read (about 30 us together, through file descriptors
kept open and ``pread``):

* this process's CPU time (``CLOCK_PROCESS_CPUTIME_ID``, every thread, nanoseconds);
* the idle time of the CPUs this process may run on (``/proc/stat``'s ``idle`` and
  ``iowait`` columns of those CPUs, in clock ticks: 10 ms on most kernels, so a reading
  is exact to a tick per CPU), plus their ``nice`` column: time of processes that
  lowered their priority (a background build at nice 10 gets a tenth of a CPU that one
  of ours wants, so it leaves that CPU to us);
* one thread's run time and its time spent runnable but waiting for a CPU
  (``/proc/self/task/TID/schedstat``, nanoseconds; the kernel's ``run_delay``): the
  runner's worker, which runs every step and leads its OpenMP team.

The CPU time nobody used plus the CPU time this process used is what other processes
left to it (:class:`~aioserve.runners.cpu.threads.thread_governor.ThreadGovernor`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

__all__ = ["LoadMeter", "LoadReading", "LoadWindow"]


@dataclass(frozen=True)
class LoadReading:
    """Counters at one moment (seconds since arbitrary origins)."""

    wall_s: float
    own_cpu_s: float
    idle_cpu_s: float
    thread_run_s: float
    thread_wait_s: float


@dataclass(frozen=True)
class LoadWindow:
    """What happened between two readings, in seconds.

    Attributes:
        wall_s: wall-clock time.
        own_cpu_s: CPU time of all of this process's threads.
        idle_cpu_s: idle (and niced) time summed over the usable CPUs.
        thread_run_s: the measured thread's CPU time.
        thread_wait_s: the measured thread's time runnable on a run queue, not running.
        num_cpus: usable CPUs the idle time was summed over.
        tick_s: resolution of ``idle_cpu_s`` per CPU and reading (one clock tick).
    """

    wall_s: float
    own_cpu_s: float
    idle_cpu_s: float
    thread_run_s: float
    thread_wait_s: float
    num_cpus: int
    tick_s: float = 0.01

    def __add__(self, other: LoadWindow) -> LoadWindow:
        """Two consecutive windows as one."""
        return LoadWindow(
            self.wall_s + other.wall_s, self.own_cpu_s + other.own_cpu_s,
            self.idle_cpu_s + other.idle_cpu_s, self.thread_run_s + other.thread_run_s,
            self.thread_wait_s + other.thread_wait_s, self.num_cpus, self.tick_s)


class LoadMeter:
    """Reads the counters of :class:`LoadReading`; made on the thread it measures.

    Args:
        cpus: the CPU ids whose idle time counts (the process's affinity).

    Raises:
        OSError: ``/proc/stat`` or the thread's ``schedstat`` cannot be read (not
            Linux, or a kernel without ``CONFIG_SCHED_INFO``).
    """

    def __init__(self, cpus: frozenset[int]) -> None:
        self.cpus = cpus
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        self._names = {f"cpu{i}".encode() for i in cpus}
        self._stat = os.open("/proc/stat", os.O_RDONLY)
        try:
            tid = threading.get_native_id()
            self._sched = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            os.close(self._stat)
            raise
        self.read()  # fails here, not mid-serving, where a file is unreadable

    def read(self) -> LoadReading:
        """The counters now."""
        wall = time.perf_counter()
        own = time.process_time()
        run, wait = os.pread(self._sched, 128, 0).split()[:2]
        idle = 0
        for line in os.pread(self._stat, 1 << 16, 0).split(b"\n")[1:]:
            if not line.startswith(b"cpu"):
                break
            fields = line.split()
            if fields[0] in self._names:  # nice, idle, iowait
                idle += int(fields[2]) + int(fields[4]) + int(fields[5])
        return LoadReading(wall, own, idle * self.tick_s, int(run) * 1e-9, int(wait) * 1e-9)

    def window(self, start: LoadReading, end: LoadReading) -> LoadWindow:
        """The window between two readings."""
        return LoadWindow(
            end.wall_s - start.wall_s, end.own_cpu_s - start.own_cpu_s,
            end.idle_cpu_s - start.idle_cpu_s, end.thread_run_s - start.thread_run_s,
            end.thread_wait_s - start.thread_wait_s, len(self.cpus), self.tick_s)

    def close(self) -> None:
        """Close the files (idempotent)."""
        for fd in (self._stat, self._sched):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stat = self._sched = -1
