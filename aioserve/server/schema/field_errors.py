"""From a pydantic ``ValidationError`` to the API's error: the first fault, worded for a
person and naming the request field at fault (``error.param``).

The wording comes from the schema itself (the kinds and bounds of the fields), so a
rule and its message are written once: ``n`` declared ``Field(ge=1, le=256)`` answers
"n must be an integer >= 1, got 0".
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from aioserve.server.schema.kinds import json_kind

#: pydantic error type -> the JSON kind the field expects.
_EXPECTED = {
    "int_type": "integer", "int_from_float": "integer", "int_parsing": "integer",
    "float_type": "number", "float_parsing": "number", "string_type": "string",
    "bool_type": "boolean", "bool_parsing": "boolean", "list_type": "array",
    "dict_type": "object", "model_type": "object", "model_attributes_type": "object",
}
_UNITS = {"List": "items", "Dictionary": "pairs", "Tuple": "items", "Set": "items"}


class RequestFieldError(ValueError):
    """A request field is missing or invalid.

    Attributes:
        param: the request field at fault (a top-level field of the body, a header
            name such as ``X-Tenant``), or None.
        code: ``invalid_value``, or ``model_not_found`` (answered as a 404).
    """

    def __init__(self, param: str | None, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def refuse(message: str, param: str | None = None, code: str = "invalid_value") -> Exception:
    """An error a validator raises with its own message (``param`` defaults to the
    field being validated)."""
    return PydanticCustomError("aioserve", "{message}",
                               {"message": message, "param": param, "code": code})


def show(value: Any) -> str:
    """A number as a message shows it (long integers cut short); other kinds by name."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return json_kind(value)
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"


def _bound(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


_RELATIONS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _path(loc: tuple[int | str, ...]) -> str:
    path = str(loc[0])
    for part in loc[1:]:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _message(error: ErrorDetails) -> str:
    kind, loc, ctx, value = error["type"], error["loc"], error.get("ctx") or {}, error["input"]
    path = _path(loc)
    if kind in _EXPECTED:
        return f"{path} must be of type {_EXPECTED[kind]}, got {json_kind(value)}"
    if kind == "missing":
        return f"{path} is required"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        relation, bound = next(iter(ctx.items()))
        noun = "a number" if type(bound) is float else "an integer"
        return f"{path} must be {noun} {_RELATIONS[relation]} {_bound(bound)}, got {show(value)}"
    if kind in ("finite_number", "number_too_large"):
        return f"{path} must be a finite number, got {show(value)}"
    if kind in ("too_short", "string_too_short"):
        least = ctx["min_length"]
        if least == 1:
            return f"{path} is empty"
        unit = _UNITS.get(ctx.get("field_type", ""), "characters")
        return f"{path} must have at least {least} {unit}"
    if kind in ("too_long", "string_too_long"):
        unit = _UNITS.get(ctx.get("field_type", ""), "characters")
        return f"{path} must have at most {ctx['max_length']} {unit}"
    if kind == "literal_error":
        return f"{path} must be {ctx['expected']}"
    return f"{path} is invalid: {error['msg']}"


def field_error(exc: ValidationError) -> RequestFieldError:
    """The API error for the first fault of a validation (fields in declaration order)."""
    error = exc.errors(include_url=False)[0]
    field = str(error["loc"][0]) if error["loc"] else None
    if error["type"] == "aioserve":
        ctx = error.get("ctx") or {}
        return RequestFieldError(ctx.get("param") or field, ctx["message"], ctx["code"])
    return RequestFieldError(field, _message(error))


def leading_word(message: str) -> str:
    """The identifier a message starts with (``"max_tokens: ..."`` -> ``max_tokens``)."""
    match = re.match(r"[A-Za-z_]+", message)
    return match.group(0) if match else ""
