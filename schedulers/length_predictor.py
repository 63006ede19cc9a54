"""Output-length predictors for length-aware policies (``spf``, ``memory_aware``), by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aioserve.scheduling import RequestView, Scheduler, SchedulerState
from aioserve.scheduling.registry import instantiate, load_object


class LengthPredictor:
    """Predicts how many output tokens a request will generate in all (>= 0): subclass it
    and define :meth:`predict`; the other hooks do nothing unless overridden. A policy calls
    them from its own hooks, so a predictor that raises is contained as the policy is
    (``PolicyGuard``: the request is served, the failure counted and logged)."""

    def predict(self, request: RequestView) -> int:
        """Predicted total output tokens of ``request`` (not just the ones left)."""
        raise NotImplementedError

    def remaining(self, request: RequestView) -> int:
        """Output tokens still to come (>= 0); default ``predict - num_output_tokens``."""
        return max(self.predict(request) - request.num_output_tokens, 0)

    def observe(self, request: RequestView) -> None:
        """``request`` arrived."""

    def on_finish(self, request: RequestView, output_len: int) -> None:
        """``request`` ended by a stop or its cap, after ``output_len`` tokens (its true
        length)."""

    def forget(self, request: RequestView) -> None:
        """``request`` ended without a length worth learning (aborted or shed)."""

    def close(self) -> None:
        """The policy is closed (engine shutdown, a simulated run's end): save what it
        learnt."""

    def ended(self, request: RequestView) -> None:
        """``request`` ended: :meth:`on_finish` with its length after a stop or its cap,
        else :meth:`forget`."""
        if request.finish_reason in ("stop", "length"):
            self.on_finish(request, request.num_output_tokens)
        else:
            self.forget(request)


class HintPredictor(LengthPredictor):
    """``hint``: the request's ``length_hint`` when the client gives one, else its
    ``max_tokens`` (a cap, so a request without a hint is treated as long)."""

    def predict(self, request: RequestView) -> int:
        hint = request.params.length_hint
        return hint if hint is not None else request.params.max_tokens


class CapPredictor(LengthPredictor):
    """``cap``: the request's ``max_tokens``, what a server reserves without a predictor."""

    def predict(self, request: RequestView) -> int:
        return request.params.max_tokens


class OraclePredictor(HintPredictor):
    """``oracle``, for upper-bound studies: the true output length of each request, from
    ``lengths`` (request id -> tokens) that the simulator or the lab's replay hands it from
    the workload it runs (no request carries its true length, so no other policy can read
    it); a request it was not told of is predicted as ``hint``. Reports label a policy
    using it an upper bound."""

    def __init__(self, lengths: Mapping[str, int] | None = None) -> None:
        self.lengths = dict(lengths or {})

    def predict(self, request: RequestView) -> int:
        true = self.lengths.get(request.request_id)
        return true if true is not None else super().predict(request)


class PredictorHooks(Scheduler):
    """A policy with a length predictor (``self.predictor``), told what the policy sees:
    each arrival, each end (finished or aborted) and the policy's close."""

    predictor: LengthPredictor

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        self.predictor.observe(request)

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        self.predictor.ended(request)

    def close(self) -> None:
        """Close the predictor (``learned`` saves its state at ``state_path``)."""
        self.predictor.close()


#: The predictors ``make_predictor`` knows by name.
PREDICTORS: dict[str, str] = {
    "hint": "schedulers.length_predictor:HintPredictor",
    "cap": "schedulers.length_predictor:CapPredictor",
    "oracle": "schedulers.length_predictor:OraclePredictor",
    "learned": "schedulers.learned_length:LearnedLengthPredictor",
}


def make_predictor(spec: LengthPredictor | str | None,
                   config: Mapping[str, Any] | None = None) -> LengthPredictor:
    """A predictor from an instance, a name in ``PREDICTORS``, a ``"package.module:Class"``
    (made with ``config`` as keyword arguments) or None (``hint``).

    Raises:
        ValueError: the spec cannot be loaded or is not a :class:`LengthPredictor`; a
            ``config`` key the predictor does not take, or a value it refuses (named)."""
    if spec is None:
        spec = "hint"
    if isinstance(spec, str):
        if spec not in PREDICTORS and ":" not in spec:
            raise ValueError(f"predictor {spec!r}: not one of {', '.join(PREDICTORS)}, nor a "
                             "'package.module:Class'")
        cls = load_object(PREDICTORS.get(spec, spec))
        if not (isinstance(cls, type) and issubclass(cls, LengthPredictor)):
            raise ValueError(f"predictor {spec!r} is not a LengthPredictor subclass")
        try:
            return instantiate(spec, cls, config, "predictor",  # type: ignore[no-any-return]
                               "predict(request)")
        except ValueError as exc:
            raise ValueError(f"predictor_config: {exc}") from None
    if config:
        raise ValueError("predictor_config needs a predictor name, not an instance")
    if not isinstance(spec, LengthPredictor):
        raise ValueError(f"predictor {spec!r} is not a LengthPredictor")
    return spec

