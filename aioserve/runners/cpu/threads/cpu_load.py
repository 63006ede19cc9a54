"""LoadMeter: this process's CPU time, the CPUs' idle time and the worker's run-queue wait."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

__all__ = ["LoadMeter", "LoadReading", "LoadWindow"]


@dataclass(frozen=True)
class LoadReading:
    wall_s: float
    own_cpu_s: float
    idle_cpu_s: float
    thread_run_s: float
    thread_wait_s: float


@dataclass(frozen=True)
class LoadWindow:
    """What happened between two readings, in seconds."""

    wall_s: float
    own_cpu_s: float
    idle_cpu_s: float
    thread_run_s: float
    thread_wait_s: float
    num_cpus: int
    tick_s: float = 0.01

    def __add__(self, other: LoadWindow) -> LoadWindow:
        return LoadWindow(
            self.wall_s + other.wall_s, self.own_cpu_s + other.own_cpu_s,
            self.idle_cpu_s + other.idle_cpu_s, self.thread_run_s + other.thread_run_s,
            self.thread_wait_s + other.thread_wait_s, self.num_cpus, self.tick_s)


class LoadMeter:
    """Reads the counters for the thread it is made on; OSError without ``/proc``."""

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
        return LoadWindow(
            end.wall_s - start.wall_s, end.own_cpu_s - start.own_cpu_s,
            end.idle_cpu_s - start.idle_cpu_s, end.thread_run_s - start.thread_run_s,
            end.thread_wait_s - start.thread_wait_s, len(self.cpus), self.tick_s)

    def close(self) -> None:
        for fd in (self._stat, self._sched):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stat = self._sched = -1
