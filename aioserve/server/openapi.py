"""``GET /openapi.json``: an OpenAPI 3.1 description of the HTTP API.

The document is exact enough for a fuzzer (schemathesis ``--checks all``): every
optional field may be ``null`` (meaning "not set", as the server reads it), integers
accept integral floats (JSON Schema's ``integer``), the rules between fields are
``if``/``then`` clauses, and the served model name and context length are filled in.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

import aioserve
from aioserve.server import openapi_responses as responses
from aioserve.server.state import ENGINE_KEY, served_model_name

_STOP = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                   {"type": "null"}]}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}

#: Fields both generation endpoints take.
_COMMON: dict[str, Any] = {
    "model": {"type": "string", "description": "must equal the served name (else 404)"},
    "temperature": {"type": "number", "minimum": 0, "description": "0 is greedy"},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "description": "0 or -1 disables"},
    "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
    "stop": _STOP,
    "stop_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "n": {"type": "integer", "minimum": 1, "maximum": 256},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object",
                       "properties": {"include_usage": {"type": ["boolean", "null"]}}},
    "ignore_eos": {"type": "boolean"},
    "include_stop_str_in_output": {"type": "boolean"},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
    "request_id": {"type": "string", "minLength": 1, "maxLength": 256,
                   "description": "must not be in use (else 400); also X-Request-Id"},
}

_COMPLETION_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        **_COMMON,
        "prompt": {"anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
            _TOKEN_IDS,
            {"type": "array", "items": _TOKEN_IDS, "minItems": 1},
        ]},
        "max_tokens": {"type": "integer", "minimum": 1, "default": 16,
                       "description": "prompt + max_tokens must fit the context"},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    },
}

_CHAT_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        **_COMMON,
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role"],
            "properties": {
                "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                "content": {"anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {
                        "type": "object", "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                    }},
                    {"type": "null"},
                ]},
            },
        }},
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1,
                                  "description": "default: the rest of the context"},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    },
}

#: Rules between fields, as JSON Schema ``if``/``then`` (a null field is "not set").
_USAGE_NEEDS_STREAM = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {
        "type": "object", "required": ["include_usage"],
        "properties": {"include_usage": {"type": "boolean"}}}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}
_TOP_LOGPROBS_NEEDS_LOGPROBS = {
    "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
    "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
}


def _request(schema: dict[str, Any], rules: list[dict[str, Any]], model: str | None,
             max_tokens: int | None) -> dict[str, Any]:
    """A request schema with optional fields nullable, the rules, the served name and
    the largest ``max_tokens`` filled in."""
    properties = {}
    for name, field in schema["properties"].items():
        field = dict(field)
        if name == "model" and model is not None:
            field["enum"] = [model]
        if name in ("max_tokens", "max_completion_tokens") and max_tokens is not None:
            field["maximum"] = max_tokens
        required = name in schema["required"]
        properties[name] = field if required else {"anyOf": [field, {"type": "null"}]}
    return {**schema, "properties": properties, "allOf": rules}


def openapi_spec(model: str | None = None, max_model_len: int | None = None) -> dict[str, Any]:
    """The OpenAPI document of the HTTP API (the websockets are in the README).

    Args:
        model: the served model name (the only ``model`` accepted), if known.
        max_model_len: the context length in tokens, if known (``max_tokens`` is below it).
    """
    limit = max_model_len - 1 if max_model_len is not None else None
    completion = _request(_COMPLETION_REQUEST, [_USAGE_NEEDS_STREAM], model, limit)
    chat = _request(_CHAT_REQUEST, [_USAGE_NEEDS_STREAM, _TOP_LOGPROBS_NEEDS_LOGPROBS],
                    model, limit)
    return {
        "openapi": "3.1.0",
        "info": {"title": "aioserve", "version": aioserve.__version__,
                 "description": "OpenAI-compatible completions and chat, health, metrics."},
        "paths": responses.paths(),
        "components": {"schemas": {"CompletionRequest": completion,
                                   "ChatCompletionRequest": chat, **responses.SCHEMAS}},
    }


async def handle(request: web.Request) -> web.Response:
    """``GET /openapi.json``, with the served model name and context length."""
    engine = request.app[ENGINE_KEY]
    max_len = engine.core.max_model_len if engine.core is not None else None
    return web.json_response(openapi_spec(served_model_name(request.app), max_len))
