"""The API's bodies, defined once with pydantic: requests (validation) and responses.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve.sampling_params, aioserve.request_meta
    never at module level: torch, numpy, transformers
"""

from aioserve.server.schema.requests import ChatCompletionRequest, CompletionRequest, WsGenerate

__all__ = ["ChatCompletionRequest", "CompletionRequest", "WsGenerate"]
