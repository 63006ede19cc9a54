"""JSON value kinds as pydantic types, read the way the API promises: a JSON boolean is
not a number, an integral number (``2.0``) is an integer (JSON Schema's ``integer``),
strings and booleans are never coerced, and non-finite numbers (the ``NaN`` and
``Infinity`` literals Python's JSON reader takes) are refused.

Each kind generates its own JSON Schema; the error translator in
:mod:`aioserve.server.schema.field_errors` words the errors.
"""

from __future__ import annotations

from typing import Annotated, Any

from annotated_types import Ge
from pydantic import AllowInfNan, BeforeValidator, GetJsonSchemaHandler, Strict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from aioserve.sampling_params import FLOAT32_MAX

__all__ = ["FLOAT32_MAX"]  # the bound of temperature and repetition_penalty

def _integral(value: Any) -> Any:
    """An integral float (``2.0``) as an int; anything else unchanged."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def _float_range(value: Any) -> Any:
    """Refuse an integer too large for a float (JSON allows 4,300 digits)."""
    if type(value) is int:
        try:
            float(value)
        except OverflowError:
            raise PydanticCustomError(
                "number_too_large", "{message}", {"message": "too large for a number"}
            ) from None
    return value


#: An integer; an integral float (``2.0``) is taken as one.
Integer = Annotated[int, Strict(), BeforeValidator(_integral)]
#: A finite number (integer or not).
Number = Annotated[float, Strict(), AllowInfNan(False), BeforeValidator(_float_range)]
#: A string (never coerced from another kind).
String = Annotated[str, Strict()]
#: A boolean (``0``, ``1``, ``"true"`` are not booleans).
Boolean = Annotated[bool, Strict()]


class TokenIdSchema:
    """Marks a token id in the JSON Schema (``x-token-id``) so the OpenAPI document can
    bound it by the served model's vocabulary (see :mod:`aioserve.server.openapi`)."""

    @staticmethod
    def __get_pydantic_json_schema__(
        schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        result = handler(schema)
        result["x-token-id"] = True
        return result


#: An integer >= 0.
NonNegative = Annotated[Integer, Ge(0)]
#: A prompt's token id: an integer >= 0 (the engine checks it is below the vocabulary
#: size; the OpenAPI document states that bound).
TokenId = Annotated[NonNegative, TokenIdSchema()]


def json_kind(value: Any) -> str:
    """The JSON name of a decoded JSON value's kind (``"a boolean"`` for booleans, so a
    message reads "must be of type integer, got a boolean")."""
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )
