"""Output-length predictors for length-aware policies (``spf``, ``memory_aware``), by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from aioserve.scheduling import RequestView
from aioserve.scheduling.registry import instantiate, load_object
from schedulers.learned_length import LearnedLengthPredictor


class LengthPredictor(Protocol):
    """Predicts how many output tokens a request will generate in all (>= 0).

    Optional, called when defined: ``remaining(request) -> int`` (tokens still to come;
    else ``predict - num_output_tokens``), ``observe(request)`` when it arrives,
    ``on_finish(request, output_len)`` with its true length when it ends by a stop or its
    cap (not when aborted or shed), ``close()`` when the policy is closed (engine shutdown,
    the simulator's run ended: save what it learnt). A policy calls them from its own hooks,
    so a predictor that raises is contained as the policy is (``PolicyGuard``: the request
    is served, the failure counted and logged)."""

    def predict(self, request: RequestView) -> int:
        """Predicted total output tokens of ``request`` (not just the ones left)."""
        ...


class HintPredictor:
    """``hint``: the request's ``length_hint`` when the client gives one, else its
    ``max_tokens`` (a cap, so a request without a hint is treated as long)."""

    upper_bound: ClassVar[bool] = False

    def predict(self, request: RequestView) -> int:
        hint = request.params.length_hint
        return hint if hint is not None else request.params.max_tokens


class CapPredictor:
    """``cap``: the request's ``max_tokens``, what a server reserves without a predictor."""

    def predict(self, request: RequestView) -> int:
        return request.params.max_tokens


class OraclePredictor(HintPredictor):
    """``oracle``, for upper-bound studies: the ``length_hint``, which ``simulate`` (and
    ``simulate --real``) fill with each request's true length for a policy using this
    predictor, and label that policy an upper bound in its reports; on a server, the hint
    the client chose to send."""

    upper_bound: ClassVar[bool] = True


#: The predictors ``make_predictor`` knows by name.
PREDICTORS: dict[str, type[Any]] = {
    "hint": HintPredictor, "cap": CapPredictor, "oracle": OraclePredictor,
    "learned": LearnedLengthPredictor,
}


def make_predictor(spec: LengthPredictor | str | None,
                   config: Mapping[str, Any] | None = None) -> LengthPredictor:
    """A predictor from an instance, a name in ``PREDICTORS``, a ``"package.module:Class"``
    (made with ``config`` as keyword arguments) or None (``hint``).

    Raises:
        ValueError: the spec cannot be loaded or has no ``predict``; a ``config`` key the
            predictor does not take, or a value it refuses (named)."""
    if spec is None:
        spec = "hint"
    if isinstance(spec, str):
        if spec not in PREDICTORS and ":" not in spec:
            raise ValueError(f"predictor {spec!r}: not one of {', '.join(PREDICTORS)}, nor a "
                             "'package.module:Class'")
        cls = PREDICTORS.get(spec) or load_object(spec)
        if not callable(cls):
            raise ValueError(f"predictor {spec!r} is not a class")
        try:
            return instantiate(spec, cls, config, "predictor",  # type: ignore[no-any-return]
                               "predict(request)")
        except ValueError as exc:
            raise ValueError(f"predictor_config: {exc}") from None
    if config:
        raise ValueError("predictor_config needs a predictor name, not an instance")
    if not callable(getattr(spec, "predict", None)):
        raise ValueError(f"predictor {spec!r} has no predict(request) method")
    return spec


def predicted_remaining(predictor: LengthPredictor, request: RequestView) -> int:
    """Output tokens the request is predicted to still generate (>= 0)."""
    remaining = getattr(predictor, "remaining", None)
    if remaining is not None:
        return max(int(remaining(request)), 0)
    return max(predictor.predict(request) - request.num_output_tokens, 0)


def is_upper_bound(predictor: object) -> bool:
    """Whether the predictor reads true lengths (reports label its policy an upper bound)."""
    return bool(getattr(predictor, "upper_bound", False))


def tell_arrival(predictor: LengthPredictor, request: RequestView) -> None:
    """Its ``observe(request)``, if it has one."""
    observe = getattr(predictor, "observe", None)
    if observe is not None:
        observe(request)


def tell_finish(predictor: LengthPredictor, request: RequestView) -> None:
    """Its ``on_finish(request, output_len)`` for a request that ended by a stop or its cap
    (``forget(request)`` for one aborted or shed), if it has them."""
    learnt = request.finish_reason in ("stop", "length")
    hook = getattr(predictor, "on_finish" if learnt else "forget", None)
    if hook is not None:
        hook(request, request.num_output_tokens) if learnt else hook(request)


def tell_close(predictor: LengthPredictor) -> None:
    """Its ``close()``, if it has one (the policy's :meth:`~Scheduler.close` calls this)."""
    close = getattr(predictor, "close", None)
    if close is not None:
        close()
