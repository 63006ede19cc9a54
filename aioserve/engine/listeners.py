"""ListenerHub: the engine's public listener hook (``AsyncEngine.add_listener``).

Every listener hears of each request that ends (``on_finish``); step listeners also get
a :class:`~aioserve.engine.observation.StepSnapshot` after a step, at most once per their
interval of the engine clock. Snapshots are built only when a listener is due, so an
engine that nobody watches pays nothing. A listener that raises is logged and skipped.
"""

from __future__ import annotations

import logging

from aioserve.engine.core import EngineCore
from aioserve.engine.observation import EngineListener, SnapshotBuilder, StepSnapshot
from aioserve.request import Request

logger = logging.getLogger(__name__)


class ListenerHub:
    """The listeners of one engine."""

    def __init__(self) -> None:
        self._listeners: list[EngineListener] = []
        self._step_listeners: dict[EngineListener, tuple[float, float]] = {}  # interval, due
        self._snapshots: SnapshotBuilder | None = None

    @property
    def has_step_listeners(self) -> bool:
        """True while some listener wants step snapshots."""
        return bool(self._step_listeners)

    def add(self, listener: EngineListener, step_interval: float | None) -> None:
        """Add ``listener``; with ``step_interval`` (seconds, 0: every step) it also gets
        step snapshots.

        Raises:
            ValueError: ``step_interval`` is negative.
        """
        if step_interval is not None and step_interval < 0:
            raise ValueError(f"step_interval must be >= 0 seconds, got {step_interval}")
        if listener not in self._listeners:
            self._listeners.append(listener)
        if step_interval is not None:
            self._step_listeners[listener] = (step_interval, float("-inf"))

    def remove(self, listener: EngineListener) -> None:
        """Stop calling ``listener``; unknown listeners are ignored."""
        if listener in self._listeners:
            self._listeners.remove(listener)
        self._step_listeners.pop(listener, None)

    def snapshot(self, core: EngineCore) -> StepSnapshot:
        """The engine's slots, queue and KV cache now."""
        return self._builder(core).build()

    def _builder(self, core: EngineCore) -> SnapshotBuilder:
        if self._snapshots is None or self._snapshots.core is not core:
            self._snapshots = SnapshotBuilder(core)
        return self._snapshots

    def publish_step(self, core: EngineCore, num_tokens: int, force: bool = False) -> None:
        """Count ``num_tokens`` sampled tokens and hand a snapshot to the step listeners
        that are due (all of them with ``force``, e.g. when the engine goes idle)."""
        builder = self._builder(core)
        builder.count_tokens(num_tokens)
        now = core.clock()
        snapshot = None
        for listener, (interval, due) in list(self._step_listeners.items()):
            if (now < due and not force) or listener not in self._step_listeners:
                continue  # not due, or removed by an earlier listener just now
            snapshot = snapshot or builder.build()
            self._step_listeners[listener] = (interval, now + interval)
            try:
                listener.on_step(snapshot)
            except Exception:
                logger.exception("listener %r failed in on_step", listener)

    def notify_finish(self, request: Request) -> None:
        """Tell every listener that ``request`` ended."""
        for listener in self._listeners:
            try:
                listener.on_finish(request)
            except Exception:
                logger.exception("listener %r failed in on_finish", listener)
