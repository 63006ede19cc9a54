"""SchedulerOutput: a policy's decision for one step."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn


class _Empty(Mapping[Any, Any]):
    """An empty, immutable, hashable mapping (a dataclass default must be hashable)."""

    def __getitem__(self, key: object) -> NoReturn:
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0


#: Empty mappings, shared.
NO_SHED: Mapping[str, str] = _Empty()
NO_CHUNKS: Mapping[str, int] = _Empty()


@dataclass(frozen=True)
class SchedulerOutput:
    """What to do before the next step. Every field is optional; the engine checks
    each one (ids in the wrong state are ignored, budgets and KV blocks are enforced).

    Attributes:
        admit: waiting request ids to start, in order; the engine admits them while
            slots, the token budget and KV blocks allow, and stops at the first that
            does not fit.
        preempt: running request ids to evict now; their KV blocks are freed and they
            are recomputed when readmitted (their generated tokens are kept).
        pause: running request ids that compute nothing this step but keep their slot
            and KV blocks (token-level preemption with the KV kept, as FastServe and
            Andes need). If pausing would leave the step empty, the engine runs them.
        shed: request id -> reason, for requests (waiting or running) to end now with
            a :class:`~aioserve.errors.RequestShedError` carrying the reason
            (admission control; HTTP 503 ``request_shed``).
        prefill_chunk: request id -> most tokens it may compute this step (>= 1): a
            per-request prefill chunk limit (Sarathi-Serve's budgets). Decoding
            requests compute one token anyway.
    """

    admit: Sequence[str] = ()
    preempt: Sequence[str] = ()
    pause: Collection[str] = ()
    shed: Mapping[str, str] = NO_SHED
    prefill_chunk: Mapping[str, int] = NO_CHUNKS


#: The decision that changes nothing (the engine's own rules still apply).
NO_DECISION = SchedulerOutput()
