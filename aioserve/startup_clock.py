"""Where a start-up's seconds go: named parts (the runner's load, the server's set-up)."""

from __future__ import annotations

import os
import time

__all__ = ["PhaseClock", "describe", "process_age_s"]


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc/self/stat``), or None."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class PhaseClock:
    """Seconds per named part (``parts``), each ending at :meth:`mark`."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.parts[name] = self.parts.get(name, 0.0) + now - self._last
        self._last = now

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def describe(parts: dict[str, float], least_s: float = 0.005) -> str:
    """``"model load 0.41 s, probes 0.12 s"``, largest first, parts under ``least_s`` out."""
    ordered = sorted(((n, s) for n, s in parts.items() if s >= least_s), key=lambda i: -i[1])
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in ordered)
