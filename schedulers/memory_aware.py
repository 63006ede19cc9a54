"""Memory-aware admission by projected KV use, with cheapest-to-recompute preemption."""

from __future__ import annotations

from typing import Any, ClassVar

from aioserve.scheduling import RequestView, SchedulerOutput, SchedulerState
from schedulers.length_predictor import LengthPredictor, PredictorHooks, make_predictor


class MemoryAwareScheduler(PredictorHooks):
    """Admit in queue order (preempted requests first, then arrival order) while the
    projected KV use of the running requests plus the candidate stays under
    ``watermark`` of the cache. A request's projection is the blocks for its prompt
    plus its predicted output (at least one token beyond what it has produced, and
    never beyond ``max_tokens``). Admission stops at the first request that does not
    fit, so a large request is not overtaken forever; a request whose projection alone
    exceeds the watermark starts when nothing else runs (never a deadlock).

    When the running requests need more blocks this step than are free, preempt the
    one cheapest to recompute (fewest computed tokens; the newest on a tie) until they
    fit, keeping at least one. The engine frees the victim's blocks, recomputes its
    prompt and output when it is readmitted, and counts the preemption (engine
    ``num_preemptions`` and the request's ``metrics.num_preemptions``); this policy
    also counts its own choices in ``preemptions``.

    Args:
        predictor: output-length predictor, by name (``hint``, the default:
            ``length_hint``, else the cap ``max_tokens``, as a server reserves; ``cap``,
            ``learned``, ``oracle``), ``"package.module:Class"`` or object.
        predictor_config: the named predictor's parameters.
        watermark: fraction of all KV blocks projected use may reach (0–1]. With the
            default 1.0 and exact predictions no request is ever preempted (every
            admitted request fits at its peak); lower it to keep headroom for requests
            that outgrow their prediction.

    Raises:
        ValueError: watermark outside (0, 1].
    """

    name: ClassVar[str] = "memory_aware"

    def __init__(self, predictor: LengthPredictor | str | None = None,
                 watermark: float = 1.0, predictor_config: dict[str, Any] | None = None,
                 ) -> None:
        if not 0 < watermark <= 1:
            raise ValueError(f"watermark must be in (0, 1], got {watermark!r}")
        self.predictor = make_predictor(predictor, predictor_config)
        self.watermark = watermark
        self.preemptions = 0

    def projected_blocks(self, state: SchedulerState, request: RequestView) -> int:
        """KV blocks the request is projected to hold when it finishes."""
        output = max(self.predictor.predict(request), request.num_output_tokens + 1)
        tokens = request.num_prompt_tokens + min(output, request.params.max_tokens)
        return -(-tokens // state.block_size)

    def victims(self, state: SchedulerState) -> list[str]:
        """Running requests to preempt so the others get this step's blocks: the
        cheapest to recompute first (fewest computed tokens, the newest on a tie)."""
        running = list(state.running)
        order = sorted(range(len(running)), key=lambda i: (running[i].num_computed_tokens, -i))
        return state.preempt_for_growth(running[i] for i in order)

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        preempt = self.victims(state)
        if preempt:
            self.preemptions += len(preempt)
            return SchedulerOutput(preempt=preempt)
        limit = int(self.watermark * state.num_total_blocks)
        projected = sum(self.projected_blocks(state, r) for r in state.running)
        admission = state.admission()
        for request in state.waiting:
            size = self.projected_blocks(state, request)
            busy = bool(state.running or admission.admitted)
            if not admission.fits(request) or (busy and projected + size > limit):
                break
            admission.admit(request)
            projected += size
        return SchedulerOutput(admit=admission.admitted)
