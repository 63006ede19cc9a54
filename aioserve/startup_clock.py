"""Where a start-up's seconds go: named parts, and the process's age.

The runner times the parts of its load (:attr:`TorchRunner.load_times
<aioserve.runners.torch.runner.TorchRunner>`), and ``aioserve serve`` logs them
with the imports, the tokenizer and the HTTP server's set-up once it is ready.
"""

from __future__ import annotations

import os
import time

__all__ = ["PhaseClock", "describe", "process_age_s"]


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: ``/proc/self/stat``'s start time, to
    a clock tick), or None where unknown."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class PhaseClock:
    """Seconds per named part, each part ending at :meth:`mark`.

    Attributes:
        parts: part name -> seconds (a name marked twice adds up).
    """

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        """End the part ``name`` now (it began at the previous mark or the clock's making)."""
        now = time.perf_counter()
        self.parts[name] = self.parts.get(name, 0.0) + now - self._last
        self._last = now

    @property
    def total(self) -> float:
        """Seconds of all parts."""
        return sum(self.parts.values())


def describe(parts: dict[str, float], least_s: float = 0.005) -> str:
    """``"model load 0.41 s, probes 0.12 s"``, largest first, parts under ``least_s``
    left out."""
    ordered = sorted(((n, s) for n, s in parts.items() if s >= least_s), key=lambda i: -i[1])
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in ordered)
