"""Sampling parameters from a JSON request body, with errors that name the field."""

from __future__ import annotations

from typing import Any

from aioserve.sampling_params import SamplingParams


class RequestFieldError(ValueError):
    """A request field is missing or invalid.

    Attributes:
        param: the field's name.
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


#: JSON field -> (SamplingParams field, accepted JSON types)
_FIELDS: dict[str, tuple[str, tuple[type, ...]]] = {
    "max_tokens": ("max_tokens", (int,)),
    "temperature": ("temperature", (int, float)),
    "top_p": ("top_p", (int, float)),
    "top_k": ("top_k", (int,)),
    "seed": ("seed", (int,)),
    "stop": ("stop", (str, list)),
    "stop_token_ids": ("stop_token_ids", (list,)),
    "ignore_eos": ("ignore_eos", (bool,)),
    "include_stop_str_in_output": ("include_stop_str_in_output", (bool,)),
    "repetition_penalty": ("repetition_penalty", (int, float)),
    "length_hint": ("length_hint", (int,)),
}


def _check_type(name: str, value: Any, types: tuple[type, ...]) -> None:
    if value is None:
        return
    if isinstance(value, bool) and bool not in types:
        raise RequestFieldError(name, f"{name} must be of type {types[0].__name__}, got a boolean")
    if not isinstance(value, types):
        expected = " or ".join(t.__name__ for t in types)
        raise RequestFieldError(name, f"{name} must be of type {expected}, got {type(value).__name__}")


def sampling_params_from_json(body: dict[str, Any], **overrides: Any) -> SamplingParams:
    """Build SamplingParams from the known fields of a JSON object (unknown fields are
    ignored; ``None`` means the default).

    Raises:
        RequestFieldError: a field has the wrong type or value; ``param`` names it.
    """
    kwargs: dict[str, Any] = {}
    for name, (field, types) in _FIELDS.items():
        value = body.get(name)
        _check_type(name, value, types)
        if value is not None:
            kwargs[field] = tuple(value) if isinstance(value, list) else value
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:
        message = str(exc)
        param = next((n for n in _FIELDS if message.startswith(n)), "")
        raise RequestFieldError(param, message) from None
