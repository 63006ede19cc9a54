"""The API's bodies, defined once with pydantic: requests (validation) and responses."""

from aioserve.server.schema.requests import ChatCompletionRequest, CompletionRequest, WsGenerate

__all__ = ["ChatCompletionRequest", "CompletionRequest", "WsGenerate"]
