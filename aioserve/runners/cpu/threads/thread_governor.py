"""ThreadGovernor: as many intra-op threads as other processes leave CPUs free.

An OpenMP team runs at its slowest thread's pace, so when others keep the CPUs busy part of the
team waits on run queues. The governor measures ``free = (own + idle CPU time) / wall`` over
windows and moves with hysteresis: down when ``free < n - DOWN_MARGIN`` and the worker waited at
least :attr:`WAIT_FRACTION` of its runnable time, for :attr:`DOWN_HOLD_S`; up when ``free >= m -
UP_MARGIN`` for the up hold (doubled after a flap); never two moves within
:attr:`MIN_MOVE_GAP_S`. Its counts all give the full count's bits on the runner's probe, so
tokens do not depend on when it moves."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from aioserve.runners.cpu.threads.cpu_load import LoadMeter, LoadReading, LoadWindow

__all__ = ["ThreadGovernor"]

logger = logging.getLogger("aioserve.threads")

#: Sums of window lengths are compared with this much tolerance (ten 0.1 s windows
#: make 0.9999999999999999 s).
EPSILON_S = 1e-9


class ThreadGovernor:
    """Chooses the intra-op thread count among ``counts`` from :class:`LoadWindow` readings."""

    #: Seconds of serving per window (evidence is gathered per window).
    WINDOW_S = 0.1
    #: ``n`` threads are kept while ``free >= n - DOWN_MARGIN`` (1.5 free CPUs keep 2).
    DOWN_MARGIN = 0.5
    #: ``m`` threads are taken once ``free >= m - UP_MARGIN`` (1.75 free CPUs give 2).
    UP_MARGIN = 0.25
    #: Least share of its runnable time the worker must have waited for a move down.
    WAIT_FRACTION = 0.15
    #: Least share of a window the worker must have been runnable in for a move down
    #: (it computed: its waits are the team's, not a hand-over's).
    BUSY_FRACTION = 0.25
    #: Seconds of serving every window must call for fewer threads before a move down.
    DOWN_HOLD_S = 0.5
    #: Seconds every window must allow more threads before a move up (doubled on flaps).
    UP_HOLD_S = 1.0
    MAX_UP_HOLD_S = 8.0
    #: A move down within this many seconds of serving after a move up is a flap.
    FLAP_S = 5.0
    #: Least seconds of serving between two moves.
    MIN_MOVE_GAP_S = 2.0

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
        self._last_move_s = -math.inf
        self._last_up_s: float | None = None
        self._pending: LoadWindow | None = None  # consecutive windows calling for a move
        self._direction = 0  # of that move: -1 down, +1 up
        self._reading: LoadReading | None = meter.read() if meter is not None else None
        # a window long enough that the idle counter's error (up to a tick per CPU)
        # stays below the band between the margins: a quiet machine never looks busy
        self.window_s = self.WINDOW_S
        if meter is not None:
            band = self.DOWN_MARGIN - self.UP_MARGIN
            self.window_s = max(self.WINDOW_S, 0.8 * len(meter.cpus) * meter.tick_s / band)

    def _fit(self, cpus: float) -> int:
        """The largest allowed count of at most ``floor(cpus)`` (at least the smallest)."""
        limit = math.floor(cpus)
        return max([c for c in self.counts if c <= limit], default=self.counts[0])

    def _direction_of(self, window: LoadWindow, n: int) -> int:
        """What one window calls for: -1 fewer threads, +1 more, 0 the same."""
        free = (window.own_cpu_s + window.idle_cpu_s) / window.wall_s
        runnable = window.thread_run_s + window.thread_wait_s
        waited = window.thread_wait_s / runnable if runnable > 0 else 0.0
        busy = runnable >= self.BUSY_FRACTION * window.wall_s
        # a long window over an idle engine measured the others alone
        idle = not busy and window.wall_s >= self.DOWN_HOLD_S
        logger.debug("window %.3f s: free %.2f CPUs, runner runnable %.0f%%, waited %.0f%%",
                     window.wall_s, free, 100 * runnable / window.wall_s, 100 * waited)
        if self._fit(free + self.DOWN_MARGIN) < n and (
                idle or busy and waited >= self.WAIT_FRACTION):
            return -1
        return 1 if self._fit(free + self.UP_MARGIN) > n else 0

    def decide(self, window: LoadWindow) -> int:
        """The count after ``window`` (a move's reason in :attr:`reason`)."""
        if window.wall_s <= 0:
            return self.threads
        n = self.threads
        self._serving_s += window.wall_s
        if self._last_up_s is not None and self._serving_s - self._last_up_s >= 4 * self.up_hold_s:
            self.up_hold_s, self._last_up_s = self.UP_HOLD_S, None  # the move up held
        direction = self._direction_of(window, n)
        if direction != self._direction or direction == 0:
            self._pending, self._direction = None, direction
        if direction == 0:
            return n
        pending = window if self._pending is None else self._pending + window
        self._pending = pending
        hold = self.DOWN_HOLD_S if direction < 0 else self.up_hold_s
        gap = self._serving_s - self._last_move_s
        if pending.wall_s < hold - EPSILON_S or gap < self.MIN_MOVE_GAP_S - EPSILON_S:
            return n
        cpus = pending.num_cpus
        free = (pending.own_cpu_s + pending.idle_cpu_s) / pending.wall_s
        error = cpus * pending.tick_s / pending.wall_s  # against the move
        shown = min(free, cpus)  # a reading a tick above every CPU is every CPU
        others = (f"other processes used {cpus - shown:.2f} of {cpus} CPUs over "
                  f"{pending.wall_s:.1f} s, leaving {shown:.2f}")
        if direction < 0:
            target = self._fit(free + error + self.DOWN_MARGIN)
            if target >= n:
                return n
            runnable = pending.thread_run_s + pending.thread_wait_s
            waited = pending.thread_wait_s / runnable if runnable > 0 else 0.0
            felt = (f"the runner waited {waited:.0%} of its runnable time" if runnable > 0
                    else "measured while the engine was idle")
            if self._last_up_s is not None and self._serving_s - self._last_up_s < self.FLAP_S:
                self.up_hold_s = min(2 * self.up_hold_s, self.MAX_UP_HOLD_S)
            self._last_up_s = None
            return self._move(target, f"{others}; {n} threads need "
                              f"{n - self.DOWN_MARGIN:.2f} and would wait on them ({felt})")
        target = self._fit(free - error + self.UP_MARGIN)
        if target <= n:
            return n
        self._last_up_s = self._serving_s
        return self._move(target, f"{others}; {target} threads need "
                          f"{target - self.UP_MARGIN:.2f}")

    def _move(self, target: int, reason: str) -> int:
        self._pending, self._direction = None, 0
        if target != self.threads:
            self.moves += 1
            self._last_move_s = self._serving_s
            self.reason = reason
            logger.info("CPU threads %d -> %d: %s", self.threads, target, reason)
            self.threads = target
        return target

    def tick(self) -> None:
        """Before each step, on the step thread: close a window, decide, apply."""
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
        if self.meter is not None:
            self.meter.close()
        self._reading = None

