"""EngineReadouts: what an engine shows of itself while it runs (counts, snapshots,
listeners), apart from serving requests."""

from __future__ import annotations

from aioserve.engine.core import EngineCore
from aioserve.engine.listeners import ListenerHub
from aioserve.engine.observation import EngineListener, StepSnapshot


class EngineReadouts:
    """Read-outs and listeners of ``AsyncEngine`` (a base class: it uses the engine's
    ``listeners`` and ``_require_core``)."""

    listeners: ListenerHub

    def _require_core(self) -> EngineCore:
        raise NotImplementedError

    def stats(self) -> dict[str, float]:
        """Running and waiting requests, KV usage (0–1), free blocks, preemptions, steps,
        and prefix-cache queried and hit tokens."""
        core = self._require_core()
        return {
            "num_running": len(core.running),
            "num_waiting": len(core.waiting),
            "kv_cache_usage": core.blocks.usage,
            "num_free_blocks": core.blocks.num_free_blocks,
            "num_preemptions": core.num_preemptions,
            "num_steps": core.step_count,
            "prefix_cache_queries": core.prefix_cache_queries,
            "prefix_cache_hits": core.prefix_cache_hits,
        }

    def add_listener(self, listener: EngineListener, *, step_interval: float | None = 0.0) -> None:
        """Call ``listener.on_finish`` for every request that ends and, unless
        ``step_interval`` is None, ``listener.on_step(snapshot)`` after a step at most
        once per ``step_interval`` seconds of the engine clock (0: every step). Both run
        in the step loop: they must not block. Works before or after :meth:`start`.

        Raises:
            ValueError: ``step_interval`` is negative.
        """
        self.listeners.add(listener, step_interval)

    def remove_listener(self, listener: EngineListener) -> None:
        """Stop calling ``listener``; unknown listeners are ignored."""
        self.listeners.remove(listener)

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (e.g. between benchmark runs); running requests are
        unaffected.

        Raises:
            EngineNotRunningError: the engine is not running.
        """
        self._require_core().blocks.reset_cache()

    def snapshot(self) -> StepSnapshot:
        """The engine's slots, queue and KV cache now (what listeners receive).

        Raises:
            EngineNotRunningError: the engine is not running.
        """
        return self.listeners.snapshot(self._require_core())
