"""The API's bodies, defined once with pydantic: requests (validation) and responses.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve.sampling_params, aioserve.request_meta
    never at module level: torch, numpy, transformers
"""

from aioserve.server.schema.requests import (
    MAX_SEQUENCES_PER_CALL,
    ChatCompletionRequest,
    CompletionRequest,
    RequestFieldError,
    Served,
    WsGenerate,
    field_of_message,
    parse,
)

__all__ = [
    "MAX_SEQUENCES_PER_CALL", "ChatCompletionRequest", "CompletionRequest",
    "RequestFieldError", "Served", "WsGenerate", "field_of_message", "parse",
]
