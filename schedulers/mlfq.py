"""Skip-join multi-level feedback queue (FastServe: Wu et al., 2023)."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Sequence
from typing import ClassVar

from aioserve.scheduling import (
    OrderedScheduler,
    PolicyReport,
    RequestView,
    SchedulerOutput,
    SchedulerState,
    StepFeedback,
)


class MLFQScheduler(OrderedScheduler):
    """Skip-join multi-level feedback queue: short requests finish at the top, long ones sink.

    Levels 0 to ``levels - 1``; level i's quantum is ``quantum * 2**i`` iterations (one
    iteration: one decode step, one output token). Skip-join: a request joins the first
    level whose quantum covers the cost of its first iteration, its prefill, counted in
    the same unit: ``num_prompt_tokens / prefill_tokens_per_iteration`` iterations (at
    least one), so only a prompt whose prefill costs more than level 0's quantum skips
    it. It drops a level each time its output tokens at its level reach the level's
    quantum, so long requests sink and short ones finish at the top, without knowing any
    length beforehand.

    Against starvation FastServe promotes a job that waited ``promote_after_s`` to level
    0. Under sustained overload that cancels the levels (every waiting job ages, and the
    promoted ones, oldest, go first: heavy-tail at 1.2x capacity for 50 s, calibrated,
    0.91x fcfs's mean E2E; without promotion 0.32x, with long jobs starved). So here a
    waiting request not served for ``promote_after_s`` is *starving*, and of the
    admissions made while starving and other requests both wait, ``promote_share`` go
    to the one served longest ago, promoted to level 0 then (a deficit counter, as
    ``priority``'s ``low_share``): no request starves, and the levels keep their order
    (0.45x with the default share, 0.68x with 0.1). A paused request (``batch_size``)
    is promoted as in FastServe.

    Preemption (on by default, ``evict``): when no slot is free, the best waiting request
    preempts running ones at least ``evict_gap`` levels worse than its own, worst first,
    if it then fits, and only where the expected gain beats the recomputation it costs
    by ``evict_margin`` (:meth:`gains`, an exchange argument as Smith's rule's:
    E[R_victim] - E[R_head] > evict_margin x (running + waiting) x the victim's
    recomputation in decode iterations, since that stall delays every request in the
    engine, with E[R | a] the mean remaining output of a request that has emitted a,
    over the lengths seen finishing, and the recomputation's cost measured from the
    steps). The exchange is one server's: with several slots the head would start at
    the first completion without any eviction, so break-even (margin 1) overstates the
    gain; the default margin 2 is the least of 1, 1.5 and 2 that keeps mean E2E within
    1.02x fcfs's on every window of both shipped traces (docs/policies-on-traces.md)
    while evicting on ``heavy-tail``. Where nothing is
    known or nothing can be gained (lengths that do not grow with service, as on the
    Azure conversation trace) it evicts nothing and orders as fcfs does. The victim
    keeps its level and is recomputed when readmitted, at most ``max_evictions`` times.
    Token-level pausing with the KV kept: with ``batch_size``, each step computes at
    most the best ``batch_size`` requests by (level, arrival), running and newly
    admitted together, and pauses the other running ones (slot and KV blocks kept, as
    FastServe keeps its job pool in memory: serve with ``--max-num-seqs`` above
    ``batch_size``); when the best ones cannot be admitted (no slot), the best paused
    ones run in their places, so a step never runs more than ``batch_size`` rows nor
    none.

    Differences from FastServe: it swaps preempted jobs' KV to host memory where this
    recomputes them (costly under a profile that charges prefill, hence the gain rule
    and ``max_evictions``; free in the flat timing); FastServe evicts for any better
    job, without a gain rule; its skip-join compares measured
    first-iteration time with the quantum, this a token ratio
    (``prefill_tokens_per_iteration``, set it from a profile: prefill tokens per second
    over steps per second).

    Args:
        levels: number of queues (>= 1; default 5).
        quantum: iterations (output tokens) of level 0's quantum (>= 1; default 16).
        prefill_tokens_per_iteration: prompt tokens whose prefill costs one iteration
            (>= 1; default 512).
        batch_size: most requests computed per step, admissions included (None: no
            pausing).
        evict: preempt worse-level running requests for a better-level waiting one
            when no slot is free (default True).
        max_evictions: most times one request is evicted so (>= 0; default 1).
        evict_gap: levels a victim is worse than the request it makes room for (>= 1;
            default 2).
        evict_margin: how many times the recomputation's cost the expected gain must be
            to evict (>= 1; default 2).
        promote_after_s: seconds without service after which a request is starving
            (default 5).
        promote_share: fraction of contested admissions that go to starving requests
            (0-1; default 0.05).
        length_prior: output lengths counted as seen finishing, so the gain rule can
            evict before lengths are learnt (default none: no eviction until
            ``MIN_SAMPLES`` have finished).

    Raises:
        ValueError: levels, quantum, prefill_tokens_per_iteration, batch_size, evict_gap
            or evict_margin below 1, a negative promotion time or max_evictions,
            promote_share outside [0, 1] (each named).
    """

    name: ClassVar[str] = "mlfq"
    #: finished output lengths kept for the expected remaining length
    LENGTHS_KEPT: ClassVar[int] = 2048
    #: finished lengths beyond a request's attained service needed to estimate its remaining
    MIN_SAMPLES: ClassVar[int] = 20

    def __init__(self, levels: int = 5, quantum: int = 16,
                 prefill_tokens_per_iteration: int = 512, batch_size: int | None = None,
                 evict: bool = True, promote_after_s: float = 5.0, max_evictions: int = 1,
                 evict_gap: int = 2, promote_share: float = 0.05,
                 watermark: float = 0.01, length_prior: Sequence[int] = (),
                 evict_margin: float = 2.0) -> None:
        super().__init__(watermark)
        for name, value in (("levels", levels), ("quantum", quantum),
                            ("prefill_tokens_per_iteration", prefill_tokens_per_iteration),
                            ("batch_size", 1 if batch_size is None else batch_size),
                            ("evict_gap", evict_gap), ("evict_margin", evict_margin)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        if max_evictions < 0:
            raise ValueError(f"max_evictions must be >= 0, got {max_evictions!r}")
        if not 0 <= promote_share <= 1:
            raise ValueError(f"promote_share must be in [0, 1], got {promote_share!r}")
        if not promote_after_s >= 0:
            raise ValueError(f"promote_after_s must be >= 0, got {promote_after_s!r}")
        self.levels, self.quantum, self.batch_size = levels, quantum, batch_size
        self.prefill_tokens_per_iteration = prefill_tokens_per_iteration
        self.evict, self.promote_after_s = evict, promote_after_s
        self.max_evictions, self.evict_gap = max_evictions, evict_gap
        self.evict_margin = evict_margin
        self.promote_share = promote_share
        self.contested = 0  # admissions while starving requests waited with others
        self.shared = 0  # of those, the starving ones'
        self.level: dict[str, int] = {}
        self.served: dict[str, int] = {}  # output tokens at its current level
        self.last_served: dict[str, float] = {}
        self.evictions = 0  # preemptions chosen for a gain
        self.decode_s = 0.0  # a decode-only step's time, recent steps weighing most
        self.token_s = 0.0  # a prefill token's marginal time
        self.measured = False
        self.recent: deque[int] = deque(maxlen=self.LENGTHS_KEPT)  # finished lengths, in order
        self.lengths: list[int] = sorted(length_prior)  # the same and the prior, sorted

    def join_level(self, request: RequestView) -> int:
        """Skip-join: the first level whose quantum covers the prefill's iterations."""
        cost = max(1.0, request.num_prompt_tokens / self.prefill_tokens_per_iteration)
        level = 0
        while level < self.levels - 1 and self.quantum << level < cost:
            level += 1
        return level

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        self.level[request.request_id] = self.join_level(request)
        self.served[request.request_id] = 0
        self.last_served[request.request_id] = request.arrival_time

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        for table in (self.level, self.served, self.last_served):
            table.pop(request.request_id, None)
        if request.finish_reason in ("stop", "length"):
            if len(self.recent) == self.recent.maxlen:
                self.lengths.pop(bisect.bisect_left(self.lengths, self.recent[0]))
            self.recent.append(request.num_output_tokens)
            bisect.insort(self.lengths, request.num_output_tokens)

    def on_step(self, feedback: StepFeedback, state: SchedulerState) -> None:
        prefill = feedback.num_prefill_tokens
        if not prefill and feedback.num_seqs:
            self.decode_s += 0.1 * (feedback.duration_s - self.decode_s)
        elif prefill and self.decode_s > 0:
            marginal = max(feedback.duration_s - self.decode_s, 0.0) / prefill
            self.token_s += 0.1 * (marginal - self.token_s)
            self.measured = True
        for request_id, emitted in zip(feedback.request_ids, feedback.num_emitted_tokens):
            if request_id not in self.level:
                continue
            self.last_served[request_id] = feedback.end_time
            self.served[request_id] += emitted
            level = self.level[request_id]
            if level < self.levels - 1 and self.served[request_id] >= self.quantum << level:
                self.level[request_id], self.served[request_id] = level + 1, 0

    def key(self, request: RequestView, state: SchedulerState) -> tuple[int, float]:
        return (self.level.get(request.request_id, 0), request.arrival_time)

    def promote(self, request_id: str, now: float) -> None:
        """FastServe's promotion: back to level 0."""
        self.level[request_id], self.served[request_id] = 0, 0
        self.last_served[request_id] = now

    def starving(self, request: RequestView, state: SchedulerState) -> bool:
        """Whether the request has not been served for ``promote_after_s``."""
        last = self.last_served.get(request.request_id, state.now)
        return state.now - last >= self.promote_after_s

    def expected_remaining(self, attained: int) -> float | None:
        """Mean output tokens left of a request that has emitted ``attained``, over the
        finished lengths seen (``E[L - a | L > a]``); None with fewer than
        ``MIN_SAMPLES`` finished longer than that (nothing known: no eviction)."""
        lengths = self.lengths
        start = bisect.bisect_right(lengths, attained)
        longer = len(lengths) - start
        if longer < self.MIN_SAMPLES:
            return None
        return (self.suffix_sum(start) - attained * longer) / longer

    def suffix_sum(self, start: int) -> int:
        """Sum of the sorted finished lengths from index ``start``."""
        return sum(self.lengths[start:])

    def gains(self, head: RequestView, victim: RequestView, state: SchedulerState) -> bool:
        """Whether evicting ``victim`` for ``head`` is expected to shorten the mean E2E:
        the exchange argument (Smith's rule, as SRPT's): running the head first saves it
        about the victim's expected remaining iterations and delays the victim by the
        head's, while the victim's recomputation stalls every running request for its
        prefill iterations, and with it every waiting one. Evict iff E[R_victim] -
        E[R_head] > evict_margin * (running + waiting) * the victim's tokens in
        iterations (:meth:`iterations`)."""
        left_victim = self.expected_remaining(victim.num_output_tokens)
        left_head = self.expected_remaining(head.num_output_tokens)
        if left_victim is None or left_head is None:
            return False
        cost = (self.evict_margin * (len(state.running) + len(state.waiting))
                * self.iterations(victim.num_tokens))
        return left_victim - left_head > cost

    def iterations(self, tokens: int) -> float:
        """Decode iterations that computing ``tokens`` prompt tokens costs: measured from
        the steps (a prefill token's marginal time over a decode-only step's), else
        ``tokens / prefill_tokens_per_iteration``."""
        if self.decode_s > 0 and self.token_s >= 0 and self.measured:
            return tokens * self.token_s / self.decode_s
        return tokens / self.prefill_tokens_per_iteration

    def report(self) -> PolicyReport:
        """``level_occupancy``: requests in the engine at each level (keys "0"...);
        ``evictions``: preemptions it chose for a gain; ``promoted_share``: the starving
        requests' measured share of contested admissions; ``expected_remaining_new``: a
        new request's expected output (tokens; absent until enough have finished)."""
        occupancy = {str(level): 0.0 for level in range(self.levels)}
        for level in self.level.values():
            occupancy[str(level)] += 1
        report: PolicyReport = {
            "level_occupancy": occupancy, "evictions": float(self.evictions),
            "promoted_share": self.shared / self.contested if self.contested else 0.0}
        expected = self.expected_remaining(0)
        if expected is not None:
            report["expected_remaining_new"] = expected
        return report

    def victims(self, state: SchedulerState) -> Iterable[RequestView]:
        return sorted(reversed(state.running), key=lambda r: self.key(r, state), reverse=True)

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        for request in state.running:  # paused ones (batch_size) are promoted as FastServe does
            if self.starving(request, state):
                self.promote(request.request_id, state.now)
        preempt = state.preempt_for_growth(self.victims(state))
        if preempt:
            idle: list[str] = []
            if self.batch_size is not None:  # the best batch_size of those left run
                staying = sorted((r for r in state.running if r.request_id not in set(preempt)),
                                 key=lambda r: self.key(r, state))
                idle = [r.request_id for r in staying[self.batch_size:]]
            return SchedulerOutput(preempt=preempt, pause=idle)
        reserve = int(self.watermark * state.num_total_blocks)
        running = sorted(state.running, key=lambda r: self.key(r, state))
        waiting = list(self.order(state))
        pause: list[str] = []
        room = len(waiting)
        if self.batch_size is not None:
            best = sorted(running + waiting, key=lambda r: self.key(r, state))
            chosen = {r.request_id for r in best[:self.batch_size]}
            pause = [r.request_id for r in running if r.request_id not in chosen]
            room = self.batch_size - (len(running) - len(pause))
        admission = state.admission(pause)
        queue = list(waiting)
        starving = sorted((self.last_served[r.request_id], r.request_id) for r in waiting
                          if r.request_id in self.last_served and self.starving(r, state))
        while queue and len(admission.admitted) < room:
            contested = 0 < len(starving) < len(queue)
            share = contested and self.shared + 1 <= self.promote_share * (self.contested + 1)
            index = 0
            if share:  # the starving ones' share: the one served longest ago
                index = next(i for i, r in enumerate(queue) if r.request_id == starving[0][1])
            request = queue[index]
            if not admission.fits(request, reserve):
                break
            admission.admit(request)
            self.contested += contested
            if share:
                self.shared += 1
                self.promote(request.request_id, state.now)
            starving = [s for s in starving if s[1] != request.request_id] if starving else starving
            del queue[index]
        preempted: list[str] = []
        left = [r for r in waiting if r.request_id not in set(admission.admitted)]
        computed = [r for r in running if r.request_id not in set(pause)]
        if self.evict and left and admission.slots <= 0 and room > len(admission.admitted):
            head = left[0]
            gap = self.key(head, state)[0] + self.evict_gap
            victims = [r for r in computed if r.num_preemptions < self.max_evictions
                       and self.key(r, state)[0] >= gap and self.gains(head, r, state)]
            while victims and self.key(head, state) < self.key(victims[-1], state):
                victim = victims.pop()
                preempted.append(victim.request_id)
                admission.release(victim)
                if admission.fits(head, reserve):
                    admission.admit(head)
                    break
            else:
                preempted = []  # the head would not fit: evict nothing
        if pause and self.batch_size is not None:  # the best paused ones fill the places left
            free = self.batch_size - len(computed) - len(admission.admitted) + len(preempted)
            if free > 0:
                kept: set[str] = set()
                for r in running:
                    if len(kept) < free and r.request_id in pause:
                        kept.add(r.request_id)
                pause = [i for i in pause if i not in kept]
        self.evictions += len(preempted)
        return SchedulerOutput(admit=admission.admitted, preempt=preempted, pause=pause)
