"""Output-length predictors for length-aware policies (``spf``, ``memory_aware``)."""

from __future__ import annotations

from typing import Protocol

from aioserve.scheduling import RequestView


class LengthPredictor(Protocol):
    """Predicts how many output tokens a request will generate in all (>= 0)."""

    def predict(self, request: RequestView) -> int:
        """Predicted total output tokens of ``request`` (not just the ones left)."""
        ...


class HintPredictor:
    """The request's ``SamplingParams.length_hint`` when given, else its ``max_tokens``
    (an upper bound, so a request without a hint is treated as long). The simulator
    passes each workload request's true output length as its hint."""

    def predict(self, request: RequestView) -> int:
        hint = request.params.length_hint
        return hint if hint is not None else request.params.max_tokens


def predicted_remaining(predictor: LengthPredictor, request: RequestView) -> int:
    """Output tokens the request is predicted to still generate (0 once it has
    produced as many as predicted)."""
    return max(predictor.predict(request) - request.num_output_tokens, 0)
