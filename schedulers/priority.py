"""Priority scheduling with a guaranteed share for lower priorities (vLLM's ``priority``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

from aioserve.scheduling import (
    Admission,
    OrderedScheduler,
    PolicyReport,
    RequestView,
    SchedulerOutput,
    SchedulerState,
)


def rank(request: RequestView) -> tuple[int, float]:
    """vLLM's order: lower ``priority`` first, then earlier arrival."""
    return (request.priority, request.arrival_time)


class PriorityScheduler(OrderedScheduler):
    """Serve lower ``priority`` values first (vLLM V1's semantics: the request field
    ``priority``, default 0, ties by arrival), preempting lower-priority work for it,
    and give each lower priority a stated share of admissions.

    * Admission: waiting requests by (priority, arrival), while slots, the token budget
      and KV blocks allow; except that each priority level L below the best waiting one
      is owed its share s_L of the admissions made while it waits together with a
      better level (contested for L; a deficit counter per level: after k such
      admissions it has had ``floor(s_L * k)``). When several levels are owed, the
      lowest (largest value) is served first, its oldest request: the share comes out of
      the lowest waiting levels first, and the top level gets all the rest. So under
      sustained overload the best class is served in order and no class starves, which
      no aging can promise (an aging bound is either shorter than the queue, and then
      aged requests jump it and cancel priority, or longer, and then it bounds nothing).
      A level owed its share is paid at the first contested admission where the best
      level has at most one request waiting, or once it is ``share_lag`` admissions
      behind, whichever comes first (a bounded deficit, as in Deficit Round Robin,
      Shreedhar and Varghese 1996): the payment then delays one top-level request, not a
      burst of them, and the measured share stays within ``share_lag`` admissions of
      ``floor(s_L * k)``.
    * Preemption for a waiting request: when the best-priority waiting request does not
      fit (no slot, or too few blocks), running requests of strictly lower priority
      are preempted, lowest first (then latest arrival), until it fits; requests
      admitted under a share are exempt until they finish (else the share would be
      preempted away). Victims are recomputed later (vllm-project/vllm#40004).
    * Under memory pressure the victim is the lowest-priority running request, then the
      latest arrival (vLLM V1's choice), before a step and when the engine evicts during one;
      the room it frees goes in the same step to waiting requests of a strictly better
      priority, if any (so a high-priority request does not wait out the lower ones'
      growth).

    Differences from vLLM: vLLM V1 has no starvation guard; its proposed aging
    (vllm-project/vllm#20608) is replaced by the shares, which keep the order of every
    class and bound what the lower ones get instead of when they start.

    Args:
        low_share: the share of every lower level that ``shares`` does not name
            (default 0.1; 0 is strict priority for it).
        shares: priority level -> its share of the admissions contested with it
            (JSON keys may be strings: ``{"1": 0.15, "2": 0.05}``). Default: none
            named, so every level below the best waiting one is owed ``low_share``.
        share_lag: how many admissions a level's share may fall behind while the best
            level has a queue (default 4; 0 pays each share at once).

    Raises:
        ValueError: low_share or a level's share outside [0, 1), shares summing to 1 or
            more, a level that is not an integer (each named), a negative share_lag, or
            a bad watermark.
    """

    name: ClassVar[str] = "priority"

    def __init__(self, low_share: float = 0.1,
                 shares: Mapping[int | str, float] | None = None,
                 share_lag: int = 4, watermark: float = 0.01) -> None:
        super().__init__(watermark)
        if isinstance(share_lag, bool) or not isinstance(share_lag, int) or share_lag < 0:
            raise ValueError(f"share_lag must be an integer >= 0, got {share_lag!r}")
        self.share_lag = share_lag
        if not 0 <= low_share < 1:
            raise ValueError(f"low_share must be in [0, 1), got {low_share!r}")
        self.low_share = low_share
        self.shares: dict[int, float] = {}
        for level, share in (shares or {}).items():
            try:
                key = int(level)
            except (TypeError, ValueError):
                raise ValueError(f"shares: level {level!r} is not an integer") from None
            if not 0 <= share < 1:
                raise ValueError(f"shares[{level!r}] must be in [0, 1), got {share!r}")
            self.shares[key] = share
        if sum(self.shares.values()) >= 1:
            raise ValueError(f"shares must sum to less than 1, got {sum(self.shares.values())}")
        self.contested: dict[int, int] = {}  # level -> admissions while it waited with a better
        self.shared: dict[int, int] = {}  # level -> of those, its own under the share
        self.protected: set[str] = set()  # admitted under a share: no priority preemption

    def share(self, level: int) -> float:
        """The level's share of the admissions contested with it."""
        return self.shares.get(level, self.low_share)

    def report(self) -> PolicyReport:
        """``share``: each lower level's configured share and ``measured_share`` what it
        got of the admissions contested with it (keys: levels); ``contested``: those
        admissions; ``protected``: requests running under a share."""
        levels = sorted({*self.shares, *self.contested})
        return {
            "share": {str(level): self.share(level) for level in levels},
            "measured_share": {str(level): self.shared.get(level, 0) / count
                               for level, count in self.contested.items() if count},
            "contested": {str(level): float(count) for level, count in self.contested.items()},
            "protected": float(len(self.protected)),
        }

    def key(self, request: RequestView, state: SchedulerState) -> tuple[int, float]:
        return rank(request)

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        """Lowest priority first, then the latest arrival."""
        return sorted(state.running, key=rank, reverse=True)

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        self.protected.discard(request.request_id)

    def on_preempt(self, request: RequestView, state: SchedulerState) -> None:
        self.protected.discard(request.request_id)

    def _admissions(self, order: list[RequestView], admission: Admission,
                    reserve: int) -> RequestView | None:
        """Admit from ``order`` with the lower levels' shares; the best-class misfit, or None."""
        while order:
            levels = sorted({r.priority for r in order}, reverse=True)  # lowest first
            lower = levels[:-1]
            for level in lower:
                self.contested[level] = self.contested.get(level, 0) + 1
            lag = 0 if sum(r.priority == levels[-1] for r in order) <= 1 else self.share_lag
            owed = next((level for level in lower if self.shared.get(level, 0) + 1 + lag
                         <= self.share(level) * self.contested[level]), None)
            index = 0 if owed is None else next(
                i for i, r in enumerate(order) if r.priority == owed)
            request = order[index]
            if not admission.fits(request, reserve):
                for level in lower:
                    self.contested[level] -= 1
                return request if index == 0 else None
            admission.admit(request)
            if owed is not None:
                self.shared[owed] = self.shared.get(owed, 0) + 1
                self.protected.add(request.request_id)
            del order[index]
        return None

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        reserve = int(self.watermark * state.num_total_blocks)
        admission = state.admission()
        growth = state.preempt_for_growth(self.victims(state))
        if growth:  # the victims' room goes only to requests of a better priority
            running = {r.request_id: r for r in state.running}
            worst = min(running[v].priority for v in growth)
            for victim in growth:
                admission.release(running[victim])
            better = [r for r in self.order(state) if r.priority < worst]
            return SchedulerOutput(admit=admission.fill(better, reserve), preempt=growth)
        head = self._admissions(list(self.order(state)), admission, reserve)
        if head is None:
            return SchedulerOutput(admit=admission.admitted)
        victims = [r for r in self.victims(state) if r.request_id not in self.protected]
        admitted = set(admission.admitted)
        waiting = [r for r in self.order(state) if r.request_id not in admitted]
        chosen: list[str] = []
        for request in waiting:  # preempt for each in order, while lower priorities run
            saved = (admission.slots, admission.budget, admission.free_blocks)
            taken: list[RequestView] = []
            while not admission.fits(request, reserve) and victims \
                    and victims[0].priority > request.priority:
                taken.append(victims.pop(0))
                admission.release(taken[-1])
            if not admission.fits(request, reserve):
                admission.slots, admission.budget, admission.free_blocks = saved
                victims[:0] = taken
                break
            admission.admit(request)
            chosen += [v.request_id for v in taken]
            for level in {r.priority for r in state.waiting if r.priority > request.priority}:
                self.contested[level] = self.contested.get(level, 0) + 1
        return SchedulerOutput(admit=admission.admitted, preempt=chosen)
