"""``GET /openapi.json``: OpenAPI 3.1, generated from the schema's models, with the served
model's name, context length and vocabulary filled in (exact enough for schemathesis)."""

from __future__ import annotations

import functools
import json
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

import aioserve
from aioserve.server.openai.chat import ChatTemplate
from aioserve.server.schema import ChatCompletionRequest, CompletionRequest, WsGenerate
from aioserve.server.schema import responses as out
from aioserve.server.schema.requests import TENANT_HEADER
from aioserve.server.state import CONFIG_KEY, ENGINE_KEY, served_model_name

_MODELS: tuple[type[BaseModel], ...] = (
    CompletionRequest, ChatCompletionRequest, WsGenerate, out.Completion, out.CompletionChunk,
    out.ChatCompletion, out.ChatCompletionChunk, out.Error, out.Model, out.ModelList,
    out.Health,
)


class _Untitled(GenerateJsonSchema):
    """JSON Schema without the ``title`` pydantic gives every field."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


@functools.lru_cache(maxsize=1)
def _schemas() -> str:
    _, top = models_json_schema([(m, "validation") for m in _MODELS],
                                ref_template="#/components/schemas/{model}",
                                schema_generator=_Untitled)
    return json.dumps(top["$defs"])


_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum",
           "lt": "exclusiveMaximum"}


def _fill(node: Any, model: str | None, max_tokens: int | None, vocab: int | None) -> None:
    """Put the served values in: ``model``'s name, the largest ``max_tokens`` and token id."""
    if isinstance(node, list):
        for item in node:
            _fill(item, model, max_tokens, vocab)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") in ("integer", "number"):  # pydantic names bounds of a type
        for raw, key in _BOUNDS.items():             # with a validator by their Python name
            if raw in node:
                node[key] = node.pop(raw)
    if node.pop("x-token-id", False) and vocab is not None:
        node["maximum"] = vocab - 1
    for name, field in node.get("properties", {}).items():
        typed = field.get("anyOf", [field])[0]
        if name == "model" and model is not None and typed.get("type") == "string":
            typed["enum"] = [model]
        if name in ("max_tokens", "max_completion_tokens", "length_hint") and (
                max_tokens is not None):
            typed["maximum"] = max_tokens
    for value in node.values():
        _fill(value, model, max_tokens, vocab)


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _event(chunk: str) -> dict[str, Any]:
    """One Server-Sent Event: a chunk, ``[DONE]``, or an error event (then no ``[DONE]``)."""
    ref = {"anyOf": [{"$ref": f"#/components/schemas/{chunk}"},
                     {"$ref": "#/components/schemas/Error"}]}
    return {"type": "object", "required": ["data"], "properties": {"data": {"anyOf": [
        {"const": "[DONE]"},
        {"type": "string", "contentMediaType": "application/json", "contentSchema": ref},
    ]}}}


_HEADERS = [
    {"name": "X-Tenant", "in": "header", "required": False,
     "description": "the tenant scheduling policies see; wins over the body's user; "
     "empty: none",
     "schema": {"type": "string", "pattern": f"^{TENANT_HEADER.pattern}$|^$"}},
    {"name": "X-Stop-After", "in": "header", "required": False,
     "description": "Benchmarking aid, not an API for clients: the request stops after this "
     "many output tokens (finish_reason stop) by a stop no scheduling policy sees, as "
     "`aioserve bench serve --workload` replays recorded lengths; max_tokens stays the cap",
     "schema": {"type": "integer", "minimum": 1}},
]


def _header_text() -> str:
    """The optional headers in words: HTTP accepts headers an operation does not name, so
    they are described, not declared as ``parameters`` (which fuzzers such as schemathesis
    read as the closed set of headers a request may carry)."""
    return "Optional headers (others are accepted and ignored): " + "; ".join(
        f"{h['name']}: {h['description']}" for h in _HEADERS)


def _generation(summary: str, request: str, response: str, chunk: str) -> dict[str, Any]:
    ok = _json(response, "a JSON response, or with stream: true Server-Sent Events")
    ok["content"]["text/event-stream"] = {"schema": _event(chunk)}
    return {"post": {
        "summary": summary,
        "description": _header_text(),
        "x-aioserve-headers": _HEADERS,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request}"}}}},
        "responses": {
            "200": ok,
            "400": _json("Error", "invalid field (error.param names it), bad JSON or encoding"),
            "404": _json("Error", "unknown model"),
            "413": _json("Error", "body over --max-body-bytes"),
            "500": _json("Error", "the model step failed"),
            "503": _json("Error", "the engine is not running, the server is shutting down, "
                         "or a scheduling policy shed the request (request_shed)"),
        },
    }}


def _paths(chat: bool) -> dict[str, Any]:
    health = {"content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Health"}}}}
    paths = {
        "/v1/completions": _generation("Text completion", "CompletionRequest", "Completion",
                                       "CompletionChunk"),
        "/v1/models": {"get": {"summary": "The served model", "responses": {
            "200": _json("ModelList", "a model list")}}},
        "/v1/models/{model}": {"get": {
            "summary": "One model (the served one)",
            "parameters": [{"name": "model", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {"200": _json("Model", "the served model"),
                          "404": _json("Error", "unknown model")}}},
        "/health": {"get": {"summary": "Liveness", "responses": {
            "200": {"description": "the engine runs", **health},
            "503": {"description": "the engine is not running, or the server is shutting "
                    "down", **health}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics (aioserve: prefix)", "responses": {
            "200": {"description": "text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
    }
    if chat:
        paths["/v1/chat/completions"] = _generation(
            "Chat completion", "ChatCompletionRequest", "ChatCompletion", "ChatCompletionChunk")
    return paths


def openapi_spec(model: str | None = None, max_model_len: int | None = None,
                 vocab_size: int | None = None, chat: bool = True) -> dict[str, Any]:
    """The OpenAPI document of the HTTP API (``WsGenerate`` in ``components``).

    Args:
        model: the served model name (the only ``model`` accepted), if known.
        max_model_len: the context length in tokens, if known.
        vocab_size: the vocabulary size, if known (token ids are below it).
        chat: describe ``/v1/chat/completions`` (False without a chat template)."""
    schemas = json.loads(_schemas())
    _fill(schemas, model, max_model_len - 1 if max_model_len is not None else None,
          vocab_size)
    return {
        "openapi": "3.1.0",
        "info": {"title": "aioserve", "version": aioserve.__version__,
                 "description": "OpenAI-compatible completions and chat, health, metrics."},
        "paths": _paths(chat),
        "components": {"schemas": schemas},
    }


async def handle(request: web.Request) -> web.Response:
    """``GET /openapi.json``."""
    engine = request.app[ENGINE_KEY]
    max_len = engine.core.max_model_len if engine.core is not None else None
    chat = ChatTemplate(engine.tokenizer, request.app[CONFIG_KEY].chat_template).available
    vocab_size = engine.runner.vocab_size if engine.runner is not None else None
    return web.json_response(openapi_spec(served_model_name(request.app), max_len, vocab_size,
                                          chat))
