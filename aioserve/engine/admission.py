"""Admission that says no: a bound on the waiting queue and on the time a request may wait.

The rule lives in the engine core, so the server, Ray Serve replicas and the simulator
(which runs the same core) all enforce and count it alike:

* ``max_waiting``: a request that arrives while ``max_waiting`` requests wait for a slot
  (preempted ones included) is refused at once with :class:`QueueFullError`. TGI bounds
  running + waiting (``--max-concurrent-requests``), which couples the limit to the batch
  size; this bound counts the queue alone, like Ray Serve's ``max_queued_requests``.
* ``max_queue_time_s``: a request not yet scheduled ``max_queue_time_s`` seconds after it
  arrived is ended with :class:`QueueTimeoutError` (its place freed). A preempted request
  has started, so it is never timed out.

Both are answered over HTTP as 429 with ``Retry-After`` and counted by reason.

``EngineConfig`` leaves both off (an embedded or offline engine queues everything it is
given); ``serve`` turns ``max_waiting`` on by default at :func:`default_max_waiting`
(``DEFAULT_WAITING_BATCHES`` batches of ``max_num_seqs``) and leaves ``max_queue_time_s``
off (a time depends on the model and the machine). A bound in batches scales with the
engine: a full queue drains in about ``DEFAULT_WAITING_BATCHES`` requests' service times
whatever the batch, which bounds the wait of an admitted request past capacity, while
bursts below capacity fit (docs/results/2026-12-07-admission-default.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from aioserve.errors import AdmissionError, QueueFullError, QueueTimeoutError
from aioserve.request import Request

#: Reasons a request is refused, as ``/metrics`` labels them.
REFUSAL_REASONS = (QueueFullError.reason, QueueTimeoutError.reason)
#: Bounds of the ``Retry-After`` advice in seconds.
RETRY_AFTER_BOUNDS = (1, 60)
#: serve's default ``max_waiting``, in batches of ``max_num_seqs``.
DEFAULT_WAITING_BATCHES = 8
#: serve's ``--max-waiting`` value that turns the limit off.
NO_LIMIT = "none"


def default_max_waiting(max_num_seqs: int) -> int:
    """serve's default bound on the waiting queue: ``DEFAULT_WAITING_BATCHES`` batches."""
    return DEFAULT_WAITING_BATCHES * max_num_seqs


def serve_max_waiting(given: int | str | None, max_num_seqs: int) -> int | None:
    """serve's ``--max-waiting`` resolved: the number given, None (no limit) for
    ``NO_LIMIT``, or :func:`default_max_waiting` when not given."""
    if given is None:
        return default_max_waiting(max_num_seqs)
    return None if given == NO_LIMIT else int(given)


def refusal_reason(error: AdmissionError) -> str:
    """A refusal as the reports count it: its reason first (``queue_full: ...``), so
    :func:`~aioserve.reports.figures.reason_kind` names the limit that said no."""
    return f"{error.reason}: {error}"


def retry_after_s(waited_s: float) -> int:
    """Seconds a refused client should wait: how long the oldest waiting request has
    waited (a new one would wait about as long), rounded up, within RETRY_AFTER_BOUNDS."""
    low, high = RETRY_AFTER_BOUNDS
    return int(min(high, max(low, math.ceil(waited_s)))) if waited_s == waited_s else low


class AdmissionLimit:
    """The limits of one engine core and the requests they refused, by reason.

    Args:
        max_waiting: most waiting requests (None: no bound).
        max_queue_time_s: most seconds from arrival to first scheduled (None: no bound).
    """

    def __init__(self, max_waiting: int | None = None,
                 max_queue_time_s: float | None = None) -> None:
        self.max_waiting = max_waiting
        self.max_queue_time_s = max_queue_time_s
        self.refused: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)

    def check(self, waiting: Iterable[Request], num_waiting: int, now: float) -> None:
        """Raise :class:`QueueFullError` (counted) when ``num_waiting`` is at the bound."""
        if self.max_waiting is None or num_waiting < self.max_waiting:
            return
        self.refused[QueueFullError.reason] += 1
        oldest = min((r.arrival_time for r in waiting), default=now)
        raise QueueFullError(
            f"the server is at capacity: {num_waiting} requests are waiting "
            f"(max_waiting {self.max_waiting}); retry later", retry_after_s(now - oldest))

    def expired(self, waiting: Iterable[Request], now: float) -> list[Request]:
        """The waiting requests never scheduled that arrived ``max_queue_time_s`` or more
        ago, each marked with its :class:`QueueTimeoutError` (counted). Never-scheduled
        requests wait in arrival order, so the scan stops at the first one still in time."""
        limit = self.max_queue_time_s
        if limit is None:
            return []
        out: list[Request] = []
        for request in waiting:
            if request.metrics.first_scheduled_time is not None:
                continue  # preempted: it has started
            if now - request.arrival_time < limit:
                break
            request.refusal = QueueTimeoutError(
                f"the request waited {limit:g} s (max_queue_time_s) without being "
                "scheduled; the server is over capacity, retry later", retry_after_s(limit))
            out.append(request)
        self.refused[QueueTimeoutError.reason] += len(out)
        return out
