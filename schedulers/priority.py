"""Priority scheduling with a guaranteed share for lower priorities (vLLM's ``priority``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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
      is owed its share s_L of the admissions *contested* with it: those made while it
      waits together with a better level, into room its oldest request could have taken
      in their place: a free slot, or room from unprotected running requests of a level
      below the top level other than L (room from the top level, from L itself or from a
      protected request is not L's to contest). A deficit counter per level: after k
      contested admissions it has had ``floor(s_L * k)``, paid at once (at most
      ``share_lag`` admissions late). When several levels are owed, the lowest (largest
      value) is paid first, its oldest request, into such room (lowest levels first,
      then latest arrival): the share comes out of the levels below the top, never the
      top level's room. A level owed its share that finds no room is paid at the next
      admission that has it. So under sustained overload the best class is served in
      order and no class starves, which no aging can promise.
    * Protection and the top level: a request admitted under a share is protected: no
      level preempts it for a waiting request, except the top level (``priority <=
      top_level``, default 0, vLLM's default priority), and that only after every
      unprotected lower-priority request is taken, and at most ``max_bumps`` (8) times
      per request. A share request so preempted (bumped) keeps its place: it resumes,
      protected again and ahead of every other request, at the first admission where no
      top-level request waits (or, bumped ``max_bumps`` times, at the first with room),
      or when its level is next paid (counted as a payment again: the share counts
      admissions). So the top level finds the room it would have under strict
      priority; the price is recomputation of the bumped requests (under a sustained
      top-level overload, up to ``max_bumps`` per share request).
    * Preemption for a waiting request: when the best-priority waiting request does not
      fit (no slot, or too few blocks), running requests of strictly lower priority
      are preempted, lowest first (then latest arrival), until it fits; protected ones
      as above. Victims are recomputed later (vllm-project/vllm#40004).
    * Under memory pressure the victim is the lowest-priority running request, then the
      latest arrival (vLLM V1's choice), before a step and when the engine evicts during one;
      the room it frees goes in the same step to waiting requests of a strictly better
      priority, if any (so a high-priority request does not wait out the lower ones'
      growth). A protected victim is bumped, as above.

    Differences from vLLM: vLLM V1 has no starvation guard; its proposed aging
    (vllm-project/vllm#20608) is replaced by the shares, which keep the order of every
    class and bound what the lower ones get instead of when they start. vLLM preempts
    any lower-priority request for a better one; here share requests give way only to
    the top level, and resume first.

    Args:
        low_share: the share of every lower level that ``shares`` does not name
            (default 0.1; 0 is strict priority for it).
        shares: priority level -> its share of the admissions contested with it
            (JSON keys may be strings: ``{"1": 0.15, "2": 0.05}``). Default: none
            named, so every level below the best waiting one is owed ``low_share``.
        share_lag: how many contested admissions a level's share may fall behind before
            it is paid (default 0: at once).
        top_level: requests of this priority or better may preempt share requests
            (default 0).
        max_bumps: how many times the top level may preempt one share request (default 8).

    Raises:
        ValueError: low_share or a level's share outside [0, 1), shares summing to 1 or
            more, a level that is not an integer (each named), a negative share_lag, or
            a bad watermark.
    """

    name: ClassVar[str] = "priority"

    def __init__(self, low_share: float = 0.1,
                 shares: Mapping[int | str, float] | None = None,
                 share_lag: int = 0, top_level: int = 0, max_bumps: int = 8,
                 watermark: float = 0.01) -> None:
        super().__init__(watermark)
        for name, value in (("share_lag", share_lag), ("max_bumps", max_bumps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if isinstance(top_level, bool) or not isinstance(top_level, int):
            raise ValueError(f"top_level must be an integer, got {top_level!r}")
        self.share_lag = share_lag
        self.top_level = top_level
        self.max_bumps = max_bumps
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
        self.waited: dict[int, int] = {}  # level -> admissions while it waited with a better
        self.protected: set[str] = set()  # running under a share: only the top level preempts
        self.bumped: set[str] = set()  # preempted while protected: waiting to resume
        self.bumps: dict[str, int] = {}  # request -> times preempted while protected
        self.num_bumped = 0

    def share(self, level: int) -> float:
        """The level's share of the admissions contested with it."""
        return self.shares.get(level, self.low_share)

    def report(self) -> PolicyReport:
        """``share``: each lower level's configured share and ``measured_share`` what it
        got of the admissions contested with it (keys: levels); ``contested``: those
        admissions; ``waited``: every admission made while the level waited with a better
        one (contested or not); ``protected``: requests running under a share; ``bumped``: share
        requests the top level has preempted, in all."""
        levels = sorted({*self.shares, *self.contested})
        return {
            "share": {str(level): self.share(level) for level in levels},
            "measured_share": {str(level): self.shared.get(level, 0) / count
                               for level, count in self.contested.items() if count},
            "contested": {str(level): float(count) for level, count in self.contested.items()},
            "waited": {str(level): float(count) for level, count in self.waited.items()},
            "protected": float(len(self.protected)),
            "bumped": float(self.num_bumped),
        }

    def key(self, request: RequestView, state: SchedulerState) -> tuple[int, float]:
        return rank(request)

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        """Lowest priority first, then the latest arrival."""
        return sorted(state.running, key=rank, reverse=True)

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        self.protected.discard(request.request_id)
        self.bumped.discard(request.request_id)
        self.bumps.pop(request.request_id, None)

    def on_preempt(self, request: RequestView, state: SchedulerState) -> None:
        if request.request_id in self.protected:  # a paid share: it resumes as one
            self.protected.discard(request.request_id)
            self.bumped.add(request.request_id)
            self.bumps[request.request_id] = self.bumps.get(request.request_id, 0) + 1
            self.num_bumped += 1

    def _room(self, request: RequestView, admission: Admission, reserve: int,
              free: list[RequestView], guarded: list[RequestView], bump: bool,
              source: Callable[[RequestView], bool]) -> list[RequestView] | None:
        """Make ``request`` fit: running requests that ``source`` allows, unprotected ones
        first (``free``, in victim order), then, if ``bump``, protected ones
        (``guarded``). The victims taken (empty: it fits as is), or None (it cannot; the
        budget and the pools are left unchanged)."""
        saved = (admission.slots, admission.budget, admission.free_blocks)
        pools = (free, guarded) if bump else (free,)
        kept = [list(pool) for pool in pools]
        taken: list[RequestView] = []
        for pool in pools:
            i = 0
            while not admission.fits(request, reserve) and i < len(pool):
                if source(pool[i]):
                    taken.append(pool.pop(i))
                    admission.release(taken[-1])
                else:
                    i += 1
        if admission.fits(request, reserve):
            return taken
        admission.slots, admission.budget, admission.free_blocks = saved
        for pool, old in zip(pools, kept):
            pool[:] = old
        return None

    @staticmethod
    def _below(level: int) -> Callable[[RequestView], bool]:
        """Room for a request of ``level``: running requests of a strictly lower priority."""
        return lambda r: r.priority > level

    def _from_others(self, level: int) -> Callable[[RequestView], bool]:
        """Room for a share paid to ``level``: a level below the top other than its own."""
        return lambda r: r.priority != level and r.priority > self.top_level

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
        victims = list(self.victims(state))
        free = [r for r in victims if r.request_id not in self.protected]
        guarded = [r for r in victims if r.request_id in self.protected
                   and self.bumps.get(r.request_id, 0) < self.max_bumps]
        order = list(self.order(state))
        chosen: list[str] = []
        skip: set[int] = set()  # levels owed a share that found no room this step
        while order:
            top_waits = order[0].priority <= self.top_level
            resume = next((i for i, r in enumerate(order) if r.request_id in self.bumped and (
                not top_waits or self.bumps.get(r.request_id, 0) >= self.max_bumps)), None)
            if resume is not None:  # a share already paid, bumped by the top level
                request = order[resume]
                taken = self._room(request, admission, reserve, free, guarded, False,
                                   self._below(request.priority))
                if taken is not None:
                    admission.admit(request)
                    chosen += [v.request_id for v in taken]
                    self.bumped.discard(request.request_id)
                    self.protected.add(request.request_id)
                    del order[resume]
                    continue
            levels = sorted({r.priority for r in order}, reverse=True)  # lowest first
            lower = levels[:-1]
            owed = next((level for level in lower if level not in skip
                         and self.shared.get(level, 0) + 1 + self.share_lag
                         <= self.share(level) * (self.contested.get(level, 0) + 1)), None)
            index = 0 if owed is None else next(
                i for i, r in enumerate(order) if r.priority == owed)
            request = order[index]
            taken = self._room(request, admission, reserve, free, guarded,
                               owed is None and request.priority <= self.top_level,
                               self._below(request.priority) if owed is None
                               else self._from_others(owed))
            if taken is None:
                if owed is None:
                    break
                skip.add(owed)  # paid at the next admission with room for it
                continue
            admission.admit(request)
            chosen += [v.request_id for v in taken]
            for level in lower:  # contested: room this level's oldest could have had
                self.waited[level] = self.waited.get(level, 0) + 1
                room = self._from_others(level)
                if all(room(v) and v.request_id not in self.protected for v in taken):
                    self.contested[level] = self.contested.get(level, 0) + 1
            if owed is not None:  # a bumped request paid again is admitted again
                self.shared[owed] = self.shared.get(owed, 0) + 1
                self.protected.add(request.request_id)
                self.bumped.discard(request.request_id)
            del order[index]
        return SchedulerOutput(admit=admission.admitted, preempt=chosen)
