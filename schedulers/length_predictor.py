"""Output-length predictors for length-aware policies (``spf``, ``memory_aware``)."""

from __future__ import annotations

from typing import Protocol

from aioserve.scheduling import RequestView
from aioserve.scheduling.registry import load_object


class LengthPredictor(Protocol):
    """Predicts how many output tokens a request will generate in all (>= 0)."""

    def predict(self, request: RequestView) -> int:
        """Predicted total output tokens of ``request`` (not just the ones left)."""
        ...


class HintPredictor:
    """The request's ``SamplingParams.length_hint`` when given, else its ``max_tokens``
    (an upper bound, so a request without a hint is treated as long). Nothing else
    gives it the true length: the simulator passes a workload's ``length_hint`` only
    when the workload sets one, as a client would."""

    def predict(self, request: RequestView) -> int:
        hint = request.params.length_hint
        return hint if hint is not None else request.params.max_tokens


def make_predictor(spec: LengthPredictor | str | None) -> LengthPredictor:
    """A predictor from an instance, a ``"package.module:Class"`` (made with no
    arguments) or None (``HintPredictor``).

    Raises:
        ValueError: the spec cannot be loaded or has no ``predict`` method.
    """
    if spec is None:
        return HintPredictor()
    predictor = load_object(spec)() if isinstance(spec, str) else spec
    if not callable(getattr(predictor, "predict", None)):
        raise ValueError(f"predictor {spec!r} has no predict(request) method")
    return predictor


def predicted_remaining(predictor: LengthPredictor, request: RequestView) -> int:
    """Output tokens the request is predicted to still generate (0 once it has
    produced as many as predicted)."""
    return max(predictor.predict(request) - request.num_output_tokens, 0)
