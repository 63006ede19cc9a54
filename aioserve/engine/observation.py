"""Observation: listeners and the step snapshots built for them (only when one is due)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from aioserve.engine.core import EngineCore
from aioserve.request import Request
from aioserve.request_meta import DEFAULT_META, RequestMeta

logger = logging.getLogger(__name__)

#: Most waiting requests a snapshot lists by name (``num_waiting`` counts them all).
MAX_WAITING_LISTED = 64


class EngineListener(Protocol):
    """Receives engine events in the step loop; both methods must return quickly and
    never block (queue work elsewhere). An exception is logged and ignored."""

    def on_step(self, snapshot: StepSnapshot) -> None:
        """After a step (at most once per the listener's ``step_interval``)."""

    def on_finish(self, request: Request) -> None:
        """A request ended (any reason: stop, length, abort, error)."""


@dataclass(frozen=True)
class SlotState:
    """The request holding one slot; ``phase`` is ``"prefill"`` (prompt or recompute
    still being fed) or ``"decode"``, counts are in tokens and KV blocks."""

    request_id: str
    phase: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    max_tokens: int
    num_blocks: int
    num_preemptions: int
    meta: RequestMeta = DEFAULT_META

    @classmethod
    def of(cls, request: Request) -> SlotState:
        behind = request.num_tokens - request.num_computed_tokens
        return cls(request.request_id, "prefill" if behind > 1 else "decode",
                   request.num_prompt_tokens, request.num_output_tokens,
                   request.num_computed_tokens, request.params.max_tokens,
                   len(request.block_ids), request.metrics.num_preemptions, request.meta)


@dataclass(frozen=True)
class StepSnapshot:
    """The engine after a step: ``time`` and ``idle_s`` in seconds of the engine clock
    (monotonic or the simulator's); ``slots`` has ``max_num_seqs`` entries (None: free),
    a request keeping its index while it runs; ``waiting`` lists the first
    :data:`MAX_WAITING_LISTED` in queue order; ``tenants`` is (tenant, running, waiting)
    per tenant, most requests first; counters are totals since the start."""

    step: int
    time: float
    scheduler: str
    slots: tuple[SlotState | None, ...]
    waiting: tuple[SlotState, ...]
    num_waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
    block_size: int
    num_preemptions: int
    num_generated_tokens: int
    tenants: tuple[tuple[str | None, int, int], ...] = ()
    idle_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; slots are compact lists ``[id, phase, prompt, output,
        computed, max_tokens, blocks, preemptions, tenant, priority]`` (None: free),
        waiting requests ``[id, preemptions, tenant, priority]``."""

        def row(s: SlotState) -> list[Any]:
            return [s.request_id, s.phase, s.num_prompt_tokens, s.num_output_tokens,
                    s.num_computed_tokens, s.max_tokens, s.num_blocks, s.num_preemptions,
                    s.meta.tenant, s.meta.priority]

        return {
            "step": self.step, "time": round(self.time, 6), "scheduler": self.scheduler,
            "slots": [None if s is None else row(s) for s in self.slots],
            "waiting": [[s.request_id, s.num_preemptions, s.meta.tenant, s.meta.priority]
                        for s in self.waiting],
            "num_waiting": self.num_waiting,
            "kv_used_blocks": self.kv_used_blocks, "kv_total_blocks": self.kv_total_blocks,
            "block_size": self.block_size, "num_preemptions": self.num_preemptions,
            "num_generated_tokens": self.num_generated_tokens,
            "tenants": [list(t) for t in self.tenants],
        }


def scheduler_name(scheduler: object) -> str:
    """A policy's display name: its ``name`` attribute, else its class name."""
    name = getattr(scheduler, "name", None)
    return name if isinstance(name, str) and name else type(scheduler).__name__


class SnapshotBuilder:
    """Snapshots of one :class:`EngineCore`; a running request keeps its slot index."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._slot_of: dict[str, int] = {}
        self.num_generated_tokens = 0

    def count_tokens(self, n: int) -> None:
        self.num_generated_tokens += n

    def build(self) -> StepSnapshot:
        core = self.core
        slots: list[SlotState | None] = [None] * core.max_num_seqs
        running = {r.request_id: r for r in core.running}
        self._slot_of = {k: i for k, i in self._slot_of.items() if k in running}
        free = [i for i in range(core.max_num_seqs) if i not in self._slot_of.values()]
        for request_id, request in running.items():
            index = self._slot_of.get(request_id)
            if index is None and free:
                index = self._slot_of[request_id] = free.pop(0)
            if index is not None:
                slots[index] = SlotState.of(request)
        waiting = tuple(SlotState.of(r) for _, r in zip(range(MAX_WAITING_LISTED), core.waiting))
        blocks = core.blocks
        counts: dict[str | None, list[int]] = {}
        for index, queue in enumerate((core.running, core.waiting)):
            for request in queue:
                counts.setdefault(request.meta.tenant, [0, 0])[index] += 1
        tenants = tuple(sorted(((t, r, w) for t, (r, w) in counts.items()),
                               key=lambda row: -(row[1] + row[2])))
        return StepSnapshot(
            core.step_count, core.clock(), scheduler_name(core.scheduler), tuple(slots),
            waiting, len(core.waiting), blocks.num_blocks - blocks.num_free_blocks,
            blocks.num_blocks, blocks.block_size, core.num_preemptions,
            self.num_generated_tokens, tenants, core.idle_s,
        )


class ListenerHub:
    """The listeners of one engine; one that raises is logged and skipped."""

    def __init__(self) -> None:
        self._listeners: list[EngineListener] = []
        self._step_listeners: dict[EngineListener, tuple[float, float]] = {}  # interval, due
        self._snapshots: SnapshotBuilder | None = None

    @property
    def has_step_listeners(self) -> bool:
        return bool(self._step_listeners)

    def add(self, listener: EngineListener, step_interval: float | None) -> None:
        if step_interval is not None and step_interval < 0:
            raise ValueError(f"step_interval must be >= 0 seconds, got {step_interval}")
        if listener not in self._listeners:
            self._listeners.append(listener)
        if step_interval is not None:
            self._step_listeners[listener] = (step_interval, float("-inf"))

    def remove(self, listener: EngineListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
        self._step_listeners.pop(listener, None)

    def snapshot(self, core: EngineCore) -> StepSnapshot:
        return self._builder(core).build()

    def _builder(self, core: EngineCore) -> SnapshotBuilder:
        if self._snapshots is None or self._snapshots.core is not core:
            self._snapshots = SnapshotBuilder(core)
        return self._snapshots

    def publish_step(self, core: EngineCore, num_tokens: int, force: bool = False) -> None:
        """Count sampled tokens; hand a snapshot to the step listeners due (all: ``force``)."""
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
        for listener in self._listeners:
            try:
                listener.on_finish(request)
            except Exception:
                logger.exception("listener %r failed in on_finish", listener)
