"""Sampling parameters and the common OpenAI fields from a JSON request body, with
errors that name the field."""

from __future__ import annotations

import re
from dataclasses import dataclass
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


_JSON_NAMES = {int: "integer", float: "number", str: "string", list: "array", dict: "object",
               bool: "boolean"}


def integral(value: Any) -> Any:
    """An integral float (``2.0``) as an int, as JSON Schema's ``integer`` and the
    OpenAI server's validation take it; any other value unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [integral(item) for item in value]
    return value


def _coerce(value: Any, types: tuple[type, ...]) -> Any:
    """``value`` with integral floats made ints where an integer is expected."""
    if float in types:
        return value
    if int in types or (list in types and isinstance(value, list)):
        return integral(value)
    return value


def _check_type(name: str, value: Any, types: tuple[type, ...]) -> None:
    if value is None:
        return
    if isinstance(value, bool) and bool not in types:
        kind = _JSON_NAMES.get(types[0])
        raise RequestFieldError(name, f"{name} must be of type {kind}, got a boolean")
    if not isinstance(value, types):
        expected = " or ".join(_JSON_NAMES.get(t, t.__name__) for t in types)
        got = _JSON_NAMES.get(type(value), "null")
        raise RequestFieldError(name, f"{name} must be of type {expected}, got {got}")


def sampling_params_from_json(body: dict[str, Any], **overrides: Any) -> SamplingParams:
    """Build SamplingParams from the known fields of a JSON object (unknown fields are
    ignored; ``None`` means the default).

    Raises:
        RequestFieldError: a field has the wrong type or value; ``param`` names it.
    """
    kwargs: dict[str, Any] = {}
    for name, (field, types) in _FIELDS.items():
        value = _coerce(body.get(name), types)
        _check_type(name, value, types)
        if value is not None:
            kwargs[field] = tuple(value) if isinstance(value, list) else value
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    seed = kwargs.get("seed")
    if isinstance(seed, int) and not SEED_MIN <= seed <= SEED_MAX:
        raise RequestFieldError("seed", f"seed must be in [{SEED_MIN}, {SEED_MAX}], got {seed}")
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:
        message = str(exc)
        raise RequestFieldError(field_of_message(message, "") or "", message) from None


#: Seeds a sampler generator accepts (torch takes a 64-bit value, signed or not).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1

_KNOWN_PARAMS = frozenset(_FIELDS) | {
    "prompt", "messages", "request_id", "n", "logprobs", "top_logprobs", "model", "stream",
    "stream_options", "max_completion_tokens",
}


def field_of_message(message: str, default: str | None = None) -> str | None:
    """The request field an error message starts with (``"max_tokens: ..."``,
    ``"prompt is empty"``), else ``default``."""
    match = re.match(r"[A-Za-z_]+", message)
    word = match.group(0) if match else ""
    return word if word in _KNOWN_PARAMS else default


def get_field(
    body: dict[str, Any], name: str, types: tuple[type, ...], default: Any = None
) -> Any:
    """``body[name]`` checked against ``types`` (a JSON boolean is not a number);
    absent or null gives ``default``.

    Raises:
        RequestFieldError: the value has another type.
    """
    value = _coerce(body.get(name), types)
    if value is None:
        return default
    _check_type(name, value, types)
    return value


#: Fields of the OpenAI API this server does not implement, with the values that mean
#: "not used"; any other value is a 400 rather than being silently ignored.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "echo": (False,),
    "suffix": ("",),
    "logit_bias": ({},),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "tools": ([],),
    "functions": ([],),
}

#: Most sequences one API call may start (n times the number of prompts).
MAX_SEQUENCES_PER_CALL = 256


@dataclass(frozen=True)
class CallOptions:
    """The fields of an OpenAI call that are not sampling parameters.

    Attributes:
        n: samples per prompt (>= 1).
        stream: answer with Server-Sent Events.
        include_usage: with ``stream``, send a usage chunk before ``[DONE]``.
        request_id: the caller's id for the call (``request_id`` field or the
            ``X-Request-Id`` header), or None to have one made.
    """

    n: int
    stream: bool
    include_usage: bool
    request_id: str | None


def check_unsupported(body: dict[str, Any]) -> None:
    """Refuse the OpenAI fields this server lacks (``echo``, ``suffix``, penalties…)
    when they ask for anything but their neutral value.

    Raises:
        RequestFieldError: naming the field.
    """
    for name, neutral in _UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and not any(type(value) is type(v) and value == v for v in neutral):
            raise RequestFieldError(name, f"{name} is not supported by this server")


def call_options(body: dict[str, Any], header_request_id: str | None) -> CallOptions:
    """Read and check ``n``, ``stream``, ``stream_options``, ``request_id`` and the
    unsupported fields.

    Raises:
        RequestFieldError: a field has the wrong type or value, or asks for a feature
            this server lacks.
    """
    check_unsupported(body)
    n = get_field(body, "n", (int,), 1)
    if n < 1:
        raise RequestFieldError("n", f"n must be an integer >= 1, got {n}")
    if n > MAX_SEQUENCES_PER_CALL:
        raise RequestFieldError("n", f"n must be at most {MAX_SEQUENCES_PER_CALL}, got {n}")
    best_of = body.get("best_of")
    if best_of is not None and not (type(best_of) is int and best_of in (1, n)):
        raise RequestFieldError("best_of", "best_of is not supported by this server")
    stream = get_field(body, "stream", (bool,), False)
    stream_options = get_field(body, "stream_options", (dict,), {})
    include_usage = get_field(stream_options, "include_usage", (bool,), False)
    if stream_options.get("include_usage") is not None and not stream:
        raise RequestFieldError("stream_options", "stream_options needs stream: true")
    request_id = get_field(body, "request_id", (str,), header_request_id)
    if request_id is not None and not 0 < len(request_id) <= 256:
        raise RequestFieldError("request_id", "request_id must have 1 to 256 characters")
    return CallOptions(n=n, stream=stream, include_usage=include_usage, request_id=request_id)
