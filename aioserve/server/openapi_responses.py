"""The response side of the OpenAPI document: paths, status codes and body schemas
(JSON responses, the Server-Sent Events stream, errors)."""

from __future__ import annotations

from typing import Any

_NULLABLE_STRING = {"type": ["string", "null"]}

ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": _NULLABLE_STRING, "code": _NULLABLE_STRING},
    }},
}

_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
          "properties": {name: {"type": "integer", "minimum": 0}
                         for name in ("prompt_tokens", "completion_tokens", "total_tokens")}}

_FINISH = {"enum": ["stop", "length", "abort", "error", None]}

_CHOICE = {"type": "object", "required": ["index", "finish_reason"],
           "properties": {"index": {"type": "integer", "minimum": 0}, "finish_reason": _FINISH}}

RESPONSE = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                   "created": {"type": "integer"}, "model": {"type": "string"},
                   "choices": {"type": "array", "items": _CHOICE}, "usage": _USAGE},
}

_CHUNK = {
    "type": "object", "required": ["id", "object", "created", "model", "choices"],
    "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                   "created": {"type": "integer"}, "model": {"type": "string"},
                   "choices": {"type": "array", "items": _CHOICE}, "usage": _USAGE},
}

#: One Server-Sent Event of a stream (OpenAPI 3.1: the schema describes each event):
#: ``data: {chunk}`` events, then ``data: [DONE]``, or ``data: {"error": {...}}`` and
#: no ``[DONE]`` when the engine failed or the server shut down.
EVENT = {
    "type": "object", "required": ["data"],
    "properties": {"data": {"anyOf": [
        {"const": "[DONE]"},
        {"type": "string", "contentMediaType": "application/json",
         "contentSchema": {"anyOf": [_CHUNK, ERROR]}},
    ]}},
}

MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"],
         "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                        "created": {"type": "integer"}, "owned_by": {"type": "string"},
                        "max_model_len": {"type": ["integer", "null"]}}}

MODEL_LIST = {"type": "object", "required": ["object", "data"],
              "properties": {"object": {"const": "list"},
                             "data": {"type": "array", "items": MODEL}}}

SCHEMAS: dict[str, Any] = {"Error": ERROR, "Response": RESPONSE, "Model": MODEL,
                           "ModelList": MODEL_LIST}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _generation(summary: str, request_schema: str) -> dict[str, Any]:
    ok = _json("Response", "a JSON response, or with stream: true Server-Sent Events")
    ok["content"]["text/event-stream"] = {"schema": EVENT}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request_schema}"}}}},
        "responses": {
            "200": ok,
            "400": _json("Error", "invalid field (error.param names it), bad JSON or encoding"),
            "404": _json("Error", "unknown model"),
            "413": _json("Error", "body over --max-body-bytes"),
            "500": _json("Error", "the model step failed"),
            "503": _json("Error", "the engine is not running, or the server is shutting down"),
        },
    }}


def paths() -> dict[str, Any]:
    """The ``paths`` object."""
    return {
        "/v1/completions": _generation("Text completion", "CompletionRequest"),
        "/v1/chat/completions": _generation("Chat completion", "ChatCompletionRequest"),
        "/v1/models": {"get": {"summary": "The served model", "responses": {
            "200": _json("ModelList", "a model list")}}},
        "/v1/models/{model}": {"get": {
            "summary": "One model (the served one)",
            "parameters": [{"name": "model", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {"200": _json("Model", "the served model"),
                          "404": _json("Error", "unknown model")}}},
        "/health": {"get": {"summary": "Liveness", "responses": {
            "200": {"description": "the engine runs",
                    "content": {"application/json": {"schema": {"type": "object"}}}},
            "503": {"description": "the engine is not running, or the server is shutting down",
                    "content": {"application/json": {"schema": {"type": "object"}}}}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics (aioserve: prefix)", "responses": {
            "200": {"description": "text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
    }
