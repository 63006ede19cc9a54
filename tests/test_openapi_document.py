"""``/openapi.json`` is generated from the models that validate the requests: every
request field is in it (and in docs/serving.md's field list), bounds are JSON Schema's own
words, the served values are filled in, chat is left out of a model that cannot chat,
and real responses match their response models."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
from server_support import CHAT_TEMPLATE, base_url, scripted_engine, serve, sse_events

from aioserve.server import ServerConfig
from aioserve.server.openapi import openapi_spec
from aioserve.server.schema import ChatCompletionRequest, CompletionRequest, WsGenerate
from aioserve.server.schema import responses as out

SERVING = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
NEW = {"priority", "user", "ttft_slo_ms", "tpot_slo_ms", "deadline", "metadata", "length_hint"}


def refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def test_every_request_field_is_in_the_document():
    spec = openapi_spec("m", 512, 512)
    schemas = spec["components"]["schemas"]
    for name, model in (("CompletionRequest", CompletionRequest),
                        ("ChatCompletionRequest", ChatCompletionRequest),
                        ("WsGenerate", WsGenerate)):
        documented = set(schemas[name]["properties"])
        assert documented >= NEW
        assert documented == set(model.model_fields) - {"best_of"}  # best_of: 1 or n only
    for path in ("/v1/completions", "/v1/chat/completions"):
        operation = spec["paths"][path]["post"]
        assert "parameters" not in operation  # any header accepted: none declared as a set
        params = operation["x-aioserve-headers"]
        assert [p["name"] for p in params] == ["X-Tenant", "X-Stop-After"]
        assert "X-Tenant: the tenant" in operation["description"]
    for name in ("CompletionRequest", "ChatCompletionRequest"):  # the rule no schema states
        n = schemas[name]["properties"]["n"]
        assert "n times the number of prompts must be at most 256" in n["description"], n
        stop = params[1]
        assert stop["schema"] == {"type": "integer", "minimum": 1}
        assert stop["description"].startswith("Benchmarking aid")
    text = json.dumps(spec)
    assert not re.search(r'"(ge|gt|le|lt|x-token-id)":', text)  # JSON Schema's words only
    assert {r.rsplit("/", 1)[1] for r in refs(spec)} <= set(schemas)


def test_the_served_values_are_filled_in():
    completion = openapi_spec("m", 512, 300)["components"]["schemas"]["CompletionRequest"]
    fields = completion["properties"]
    assert fields["model"]["anyOf"][0]["enum"] == ["m"]
    assert fields["max_tokens"]["anyOf"][0]["maximum"] == 511
    assert fields["length_hint"]["anyOf"][0]["maximum"] == 511
    ids = fields["prompt"]["anyOf"][2]["items"]
    assert (ids["minimum"], ids["maximum"]) == (0, 299)
    assert "maximum" not in fields["stop_token_ids"]["anyOf"][0]["items"]  # any id stops


def test_the_serving_docs_list_every_request_field():
    paragraph = SERVING.read_text().split("Request fields:", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([a-z_]+)", paragraph))
    fields = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert fields - named == {"prompt", "messages"}  # in the table of routes above it


async def test_chat_is_documented_only_for_a_model_that_can_chat(tokenizer):
    for template, has_chat in ((None, False), (CHAT_TEMPLATE, True)):
        config = ServerConfig(chat_template=template)
        async with serve(scripted_engine(tokenizer, [300]), config) as srv, \
                aiohttp.ClientSession() as s, s.get(base_url(srv) + "/openapi.json") as r:
            paths = (await r.json())["paths"]
        assert ("/v1/chat/completions" in paths) == has_chat
        assert "/v1/completions" in paths


async def test_responses_match_their_models(tokenizer):
    engine = scripted_engine(tokenizer, [300, 301, 302])
    config = ServerConfig(chat_template=CHAT_TEMPLATE, served_model_name="m")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    completion = {"prompt": ["Once", "upon"], "max_tokens": 3, "n": 2, "logprobs": 2}
    async with serve(engine, config) as srv, aiohttp.ClientSession() as s:
        url = base_url(srv)
        for path, body, whole, chunk in (
            ("/v1/completions", completion, out.Completion, out.CompletionChunk),
            ("/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 2},
             out.ChatCompletion, out.ChatCompletionChunk),
        ):
            async with s.post(url + path, json=body) as r:
                whole.model_validate_json(await r.text())
            stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
            async with s.post(url + path, json=stream) as r:
                events = await sse_events(r)
            assert events[-1] == "[DONE]" and events[-2]["usage"]
            for event in events[:-1]:
                chunk.model_validate(event)
        async with s.post(url + "/v1/completions", json={"prompt": ""}) as r:
            out.Error.model_validate_json(await r.text())
        async with s.get(url + "/v1/models") as r:
            out.ModelList.model_validate_json(await r.text())
        async with s.get(url + "/health") as r:
            out.Health.model_validate_json(await r.text())
