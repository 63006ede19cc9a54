"""The HTTP and websocket API's bodies, defined once with pydantic: the request models
validate what clients send (errors name the field, in the API's words), and the same
models, with the response models, generate ``/openapi.json``
(:mod:`aioserve.server.openapi`). Nothing here uses aiohttp or the engine.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve.sampling_params, aioserve.request_meta
    never at module level: torch, numpy, transformers
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from aioserve.server.schema.field_errors import RequestFieldError, field_error, leading_word
from aioserve.server.schema.fields import Served
from aioserve.server.schema.prompts import MAX_SEQUENCES_PER_CALL
from aioserve.server.schema.requests import (
    CallOptions,
    ChatCompletionRequest,
    CompletionRequest,
    WsGenerate,
)

__all__ = [
    "MAX_SEQUENCES_PER_CALL", "CallOptions", "ChatCompletionRequest", "CompletionRequest",
    "RequestFieldError", "Served", "WsGenerate", "field_of_message", "parse",
]

Body = TypeVar("Body", bound=BaseModel)


def parse(model: type[Body], body: dict[str, Any], served: Served | None = None) -> Body:
    """``body`` (a decoded JSON object) read as ``model``.

    Raises:
        RequestFieldError: the first fault, naming its field (code ``model_not_found``
            when ``model`` names another model than ``served.model``).
    """
    try:
        return model.model_validate(body, context=served)
    except ValidationError as exc:
        raise field_error(exc) from None


_FIELDS = frozenset().union(*(m.model_fields for m in (
    CompletionRequest, ChatCompletionRequest, WsGenerate)))


def field_of_message(message: str, default: str | None = None) -> str | None:
    """The request field an engine error message starts with (``"max_tokens: ..."``,
    ``"prompt is empty"``, ``"request_id ... is already in use"``), else ``default``."""
    word = leading_word(message)
    return word if word in _FIELDS else default
