"""ThreadGovernor: as many intra-op threads as other processes leave CPUs free.

An OpenMP team runs each parallel region at the pace of its slowest thread. When other
processes keep the CPUs busy, the kernel shares each CPU among them and some of the
team's threads wait on a run queue while the rest spin at the region's barrier: on the
2-core box, with two busy co-tenants, two threads gave 299 output tokens/s and one
gave 2,355 (issue 26). The governor measures, over short windows of serving
(:class:`~aioserve.runners.cpu.threads.cpu_load.LoadWindow`), the CPUs left to this process,
``free = (own CPU time + idle CPU time) / wall time`` (what the others did not take),
and moves the team's size:

* **down** to ``floor(free + SLACK)`` when that is below the current count and the
  runner's worker waited on a run queue for at least :attr:`WAIT_FRACTION` of its
  runnable time: others take CPUs and the team suffers for it (a window is long enough
  that the idle counter's error, up to a clock tick per CPU, stays below ``SLACK``); or
  at once after the engine was idle for :attr:`UP_HOLD_S` or more, the window having
  measured the others alone;
* **up** when ``free`` says more CPUs are left over :attr:`UP_HOLD_S` of serving (the
  error again against the move). The engine's idle time counts: a window that spans an
  idle engine measures the others alone, so a team goes back up at the first step after
  the co-tenants left. A move up that is undone within :attr:`FLAP_S` doubles the hold
  (up to :attr:`MAX_UP_HOLD_S`); a move up that holds resets it.

On a quiet machine ``free`` is every usable CPU, so nothing moves (the same count as
without the governor: the quiet case costs one ``perf_counter`` per step and about 30 us
of ``/proc`` reads per window). The counts it may choose are given: the runner allows
only those whose logits equal the full count's bit for bit on its probe, so a
request's tokens do not depend on when the team changes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from aioserve.runners.cpu.threads.cpu_load import LoadMeter, LoadReading, LoadWindow

__all__ = ["ThreadGovernor", "threads_in_use"]

logger = logging.getLogger("aioserve.threads")


class ThreadGovernor:
    """Chooses the intra-op thread count from :class:`LoadWindow` measurements.

    Args:
        counts: the thread counts it may use; it starts at the largest.
        meter: the source of windows for :meth:`tick` (None: only :meth:`decide`).
        set_threads: applies a count (``torch.set_num_threads``; called by :meth:`tick`,
            so on the thread that runs the steps).
        clock: seconds, for :meth:`tick`'s windows.

    Raises:
        ValueError: no count, or a count below 1.
    """

    #: Seconds of serving per window (down moves are decided per window).
    WINDOW_S = 0.1
    #: Added to ``free`` before rounding down: 1.75 free CPUs keep 2 threads.
    SLACK = 0.25
    #: Least share of its runnable time the worker must have waited for a move down.
    WAIT_FRACTION = 0.15
    #: Least share of a window the worker must have been runnable in for a move down
    #: (it computed: its waits are the team's, not a hand-over's).
    BUSY_FRACTION = 0.25
    #: Seconds ``free`` must allow more threads before a move up (doubled on flaps).
    UP_HOLD_S = 0.3
    MAX_UP_HOLD_S = 8.0
    #: A move down within this many seconds of serving after a move up is a flap.
    FLAP_S = 1.0

    def __init__(
        self, counts: Sequence[int], meter: LoadMeter | None = None,
        set_threads: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not counts or min(counts) < 1:
            raise ValueError(f"thread counts must be positive, got {list(counts)!r}")
        self.counts = sorted(set(counts))
        self.threads = self.counts[-1]
        self.meter = meter
        self.set_threads = set_threads
        self.clock = clock
        self.up_hold_s = self.UP_HOLD_S
        self.reason = "start"
        self.moves = 0
        self._serving_s = 0.0  # seconds of windows seen
        self._last_up_s: float | None = None
        self._pending: LoadWindow | None = None  # windows that all allowed a move up
        self._reading: LoadReading | None = meter.read() if meter is not None else None
        # a window long enough that the idle counter's error (up to a tick per CPU)
        # stays below SLACK: a quiet machine never looks busy
        self.window_s = self.WINDOW_S
        if meter is not None:
            self.window_s = max(self.WINDOW_S, 0.8 * len(meter.cpus) * meter.tick_s / self.SLACK)

    def _fit(self, cpus: float) -> int:
        """The largest allowed count of at most ``floor(cpus)`` threads (at least the
        smallest allowed)."""
        limit = math.floor(cpus)
        return max([c for c in self.counts if c <= limit], default=self.counts[0])

    def decide(self, window: LoadWindow) -> int:
        """The count to use after ``window`` (also kept in :attr:`threads`, with the
        reason of a move in :attr:`reason`)."""
        if window.wall_s <= 0:
            return self.threads
        n = self.threads
        self._serving_s += window.wall_s
        if self._last_up_s is not None and self._serving_s - self._last_up_s >= 4 * self.up_hold_s:
            self.up_hold_s, self._last_up_s = self.UP_HOLD_S, None  # the move up held
        free = (window.own_cpu_s + window.idle_cpu_s) / window.wall_s
        runnable = window.thread_run_s + window.thread_wait_s
        waited = window.thread_wait_s / runnable if runnable > 0 else 0.0
        busy = runnable >= self.BUSY_FRACTION * window.wall_s
        # a long window over an idle engine measured the others alone: no need to suffer
        idle = not busy and window.wall_s >= self.UP_HOLD_S
        logger.debug("window %.3f s: free %.2f CPUs, runner runnable %.0f%%, waited %.0f%%",
                     window.wall_s, free, 100 * runnable / window.wall_s, 100 * waited)
        if self._fit(free + self.SLACK) < n and (idle or busy and waited >= self.WAIT_FRACTION):
            target = self._fit(free + self.SLACK)
            if self._last_up_s is not None and self._serving_s - self._last_up_s < self.FLAP_S:
                self.up_hold_s = min(2 * self.up_hold_s, self.MAX_UP_HOLD_S)
            self._last_up_s = None
            self._pending = None
            return self._move(target, f"other processes leave {free:.1f} of "
                              f"{window.num_cpus} CPUs; the runner waited {waited:.0%} "
                              "of its runnable time")
        if self._fit(free + self.SLACK) <= n:
            self._pending = None
            return n
        pending = window if self._pending is None else self._pending + window
        self._pending = pending
        if pending.wall_s < self.up_hold_s:
            return n
        free = (pending.own_cpu_s + pending.idle_cpu_s) / pending.wall_s
        error = pending.num_cpus * pending.tick_s / pending.wall_s
        target = self._fit(free - error + self.SLACK)
        if target <= n:
            return n
        self._pending = None
        self._last_up_s = self._serving_s
        return self._move(target, f"{free:.1f} of {window.num_cpus} CPUs free for "
                          f"{pending.wall_s:.1f} s")

    def _move(self, target: int, reason: str) -> int:
        if target != self.threads:
            self.moves += 1
            self.reason = reason
            logger.info("CPU threads %d -> %d: %s", self.threads, target, reason)
            self.threads = target
        return target

    def tick(self) -> None:
        """Call before each step, on the thread that runs the steps: closes a window
        every :attr:`WINDOW_S` seconds, decides, and applies a new count."""
        if self.meter is None or self._reading is None:
            return
        if self.clock() - self._reading.wall_s < self.window_s:
            return
        reading = self.meter.read()
        before = self.threads
        after = self.decide(self.meter.window(self._reading, reading))
        self._reading = reading
        if after != before and self.set_threads is not None:
            self.set_threads(after)

    def close(self) -> None:
        """Stop measuring (idempotent)."""
        if self.meter is not None:
            self.meter.close()
        self._reading = None


def threads_in_use(runner: object) -> int | None:
    """The intra-op threads ``runner`` computes with now: its governor's count, else its
    fixed ``num_threads`` (None: unknown, or torch's own setting off the CPU)."""
    governor = getattr(runner, "governor", None)
    if isinstance(governor, ThreadGovernor):
        return governor.threads
    threads = getattr(runner, "num_threads", None)
    return threads if isinstance(threads, int) else None
