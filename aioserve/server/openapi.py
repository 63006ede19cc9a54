"""``GET /openapi.json``: an OpenAPI 3.1 description of the HTTP API."""

from __future__ import annotations

from typing import Any

from aiohttp import web

import aioserve

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
                       "properties": {"include_usage": {"type": "boolean"}}},
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
            "type": "object", "required": ["role", "content"],
            "properties": {
                "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                "content": {"anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {
                        "type": "object", "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                    }},
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

_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]},
                       "code": {"type": ["string", "null"]}},
    }},
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _generation(summary: str, schema: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {
            "200": {"description": "a JSON response, or with stream: true Server-Sent Events "
                                   "(data: {chunk} ... data: [DONE])",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            "400": _error("invalid field (error.param names it), bad JSON or encoding"),
            "404": _error("unknown model"),
            "413": _error("body over --max-body-bytes"),
            "500": _error("the model step failed"),
            "503": _error("the engine is not running"),
        },
    }}


def openapi_spec() -> dict[str, Any]:
    """The OpenAPI document of the HTTP API (the websocket ``/ws`` is in the README)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "aioserve", "version": aioserve.__version__,
                 "description": "OpenAI-compatible completions and chat, health, metrics."},
        "paths": {
            "/v1/completions": _generation("Text completion", "CompletionRequest"),
            "/v1/chat/completions": _generation("Chat completion", "ChatCompletionRequest"),
            "/v1/models": {"get": {"summary": "The served model",
                                   "responses": {"200": {"description": "a model list"}}}},
            "/health": {"get": {"summary": "Liveness", "responses": {
                "200": {"description": "the engine runs"},
                "503": {"description": "the engine is not running"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (aioserve: prefix)",
                                 "responses": {"200": {"description": "text format"}}}},
        },
        "components": {"schemas": {"CompletionRequest": _COMPLETION_REQUEST,
                                   "ChatCompletionRequest": _CHAT_REQUEST, "Error": _ERROR}},
    }


async def handle(request: web.Request) -> web.Response:
    """``GET /openapi.json``."""
    return web.json_response(openapi_spec())
