"""The OpenAI-compatible API with the real ``openai`` client and the real tiny model."""

from __future__ import annotations

import os
import re

import aiohttp
import openai
import pytest
from server_support import CHAT_TEMPLATE, base_url, scripted_engine, serve

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.server import ServerConfig

PROMPT = "Once upon a time"


def client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(server) + "/v1", api_key="unused",
                              max_retries=0, timeout=30)


async def direct(engine: AsyncEngine, prompt, params: SamplingParams) -> tuple[str, list[int], str]:
    text, tokens, reason = "", [], None
    async for out in engine.generate(prompt, params):
        text += out.text
        tokens += out.token_ids
        reason = out.finish_reason
    return text, tokens, reason


@pytest.fixture
async def model_server(model_dir):
    engine = AsyncEngine(EngineConfig(model=model_dir, num_kv_blocks=64))
    config = ServerConfig(served_model_name="stories", chat_template=CHAT_TEMPLATE)
    async with serve(engine, config) as server:
        yield server, engine


async def test_models_lists_the_served_name(model_server):
    server, _ = model_server
    models = await client(server).models.list()
    assert [m.id for m in models.data] == ["stories"]


async def test_completion_equals_engine_output_streamed_or_not(model_server, tokenizer):
    server, engine = model_server
    c = client(server)
    expected_text, expected_ids, reason = await direct(
        engine, PROMPT, SamplingParams(max_tokens=24, temperature=0))
    result = await c.completions.create(model="stories", prompt=PROMPT, max_tokens=24,
                                        temperature=0)
    assert result.choices[0].text == expected_text
    assert result.choices[0].finish_reason == reason == "length"
    assert result.usage.prompt_tokens == len(tokenizer(PROMPT).input_ids) == 5
    assert result.usage.completion_tokens == len(expected_ids) == 24
    assert result.usage.total_tokens == 29

    stream = await c.completions.create(model="stories", prompt=PROMPT, max_tokens=24,
                                        temperature=0, stream=True,
                                        stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == expected_text
    usage = [ch.usage for ch in chunks if ch.usage is not None]
    assert len(usage) == 1 and chunks[-1].usage is not None
    assert (usage[0].prompt_tokens, usage[0].completion_tokens) == (5, 24)


async def test_prompt_forms_token_ids_and_lists(model_server, tokenizer):
    server, engine = model_server
    c = client(server)
    ids = tokenizer(PROMPT).input_ids
    expected, _, _ = await direct(engine, PROMPT, SamplingParams(max_tokens=8, temperature=0))
    other, _, _ = await direct(engine, "One day", SamplingParams(max_tokens=8, temperature=0))
    by_ids = await c.completions.create(model="stories", prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == expected
    many = await c.completions.create(model="stories", prompt=[PROMPT, "One day"],
                                      max_tokens=8, temperature=0)
    assert [ch.text for ch in many.choices] == [expected, other]
    assert [ch.index for ch in many.choices] == [0, 1]
    assert many.usage.completion_tokens == 16
    many_ids = await c.completions.create(model="stories", prompt=[ids, ids], max_tokens=8,
                                          temperature=0)
    assert [ch.text for ch in many_ids.choices] == [expected, expected]


async def test_n_samples_with_a_seed_are_reproducible(model_server):
    server, _ = model_server
    c = client(server)
    kwargs = dict(model="stories", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=7, n=3)
    first = await c.completions.create(**kwargs)
    second = await c.completions.create(**kwargs)
    assert [ch.text for ch in first.choices] == [ch.text for ch in second.choices]
    assert len({ch.text for ch in first.choices}) > 1  # seed + i: the samples differ
    assert first.usage.completion_tokens == 36 and first.usage.prompt_tokens == 5


async def test_logprobs_for_completions_and_chat(model_server):
    server, _ = model_server
    c = client(server)
    result = await c.completions.create(model="stories", prompt=PROMPT, max_tokens=5,
                                        temperature=0, logprobs=2)
    lp = result.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == result.choices[0].text
    for value, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and len(top) == 2 and max(top.values()) == pytest.approx(value)
    chat = await c.chat.completions.create(
        model="stories", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
        temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(e.top_logprobs) == 3 for e in content)


async def test_chat_uses_the_template_and_equals_the_engine(model_server, tokenizer):
    server, engine = model_server
    c = client(server)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    rendered = "system: Be brief.\nuser: Hello\nassistant:"
    prompt_ids = tokenizer(rendered, add_special_tokens=False).input_ids
    expected, ids, _ = await direct(engine, prompt_ids, SamplingParams(max_tokens=10,
                                                                       temperature=0))
    result = await c.chat.completions.create(model="stories", messages=messages,
                                             max_completion_tokens=10, temperature=0)
    assert result.choices[0].message.content == expected
    assert result.choices[0].message.role == "assistant"
    assert result.usage.prompt_tokens == len(prompt_ids)
    assert result.usage.completion_tokens == len(ids) == 10
    stream = await c.chat.completions.create(model="stories", messages=messages,
                                             max_tokens=10, temperature=0, stream=True)
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == expected
    assert [ch.choices[0].finish_reason for ch in chunks][-1] == "length"


async def test_chat_default_max_tokens_is_the_rest_of_the_context(tokenizer):
    engine = scripted_engine(tokenizer, [300], max_model_len=48)
    async with serve(engine, ServerConfig(chat_template=CHAT_TEMPLATE)) as server:
        result = await client(server).chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "Hello"}],
            extra_body={"ignore_eos": True})
    assert result.usage.prompt_tokens + result.usage.completion_tokens == 48
    assert result.choices[0].finish_reason == "length"


async def test_chat_without_any_template_is_a_400_that_says_so(model_dir):
    engine = AsyncEngine(EngineConfig(model=model_dir, num_kv_blocks=16))
    async with serve(engine) as server:
        with pytest.raises(openai.BadRequestError) as info:
            await client(server).chat.completions.create(
                model=model_dir, messages=[{"role": "user", "content": "Hi"}])
        assert "chat template" in info.value.body["message"]
        assert info.value.body["param"] == "messages"
        models = await client(server).models.list()
        # default name: the model directory's own name, never its path (issue 52)
        assert [m.id for m in models.data] == [os.path.basename(os.path.abspath(model_dir))]


async def test_a_symlinked_model_directory_is_served_under_the_link_s_name(
        model_dir, tmp_path, monkeypatch):
    """``--model ./linked/`` (a symbolic link to the model) is served as ``linked``: the
    name the user gave, never the link's target; ``$PWD/linked`` is accepted too."""
    (tmp_path / "linked").symlink_to(os.path.abspath(model_dir), target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    name = os.path.join(os.getcwd(), "linked")
    assert os.path.realpath(name) != name
    engine = AsyncEngine(EngineConfig(model="./linked/", num_kv_blocks=16))
    async with serve(engine) as server:
        models = await client(server).models.list()
        assert [m.id for m in models.data] == ["linked"]
        result = await client(server).completions.create(model=name, prompt=PROMPT,
                                                         max_tokens=2, temperature=0)
        assert result.model == "linked"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True])
async def test_the_request_id_is_echoed_in_x_request_id(model_server, path, stream):
    server, _ = model_server
    url = base_url(server) + path
    body = {"model": "stories", "max_tokens": 2, "stream": stream,
            **({"prompt": PROMPT} if path == "/v1/completions"
               else {"messages": [{"role": "user", "content": PROMPT}]})}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.post(url, json=body, headers={"X-Request-Id": "client-7"}) as given:
            await given.read()
        async with http.post(url, json={**body, "request_id": "field-8"}) as field:
            await field.read()
        made = []
        for _ in range(2):
            async with http.post(url, json=body) as reply:
                await reply.read()
                made.append(reply.headers.get("X-Request-Id"))
        async with http.post(url, json={**body, "max_tokens": -1},
                             headers={"X-Request-Id": "client-9"}) as refused:
            await refused.read()
    assert refused.status == 400 and refused.headers["X-Request-Id"] == "client-9"
    assert given.status == field.status == reply.status == 200
    assert given.headers["X-Request-Id"] == "client-7"
    assert field.headers["X-Request-Id"] == "field-8"
    assert all(re.fullmatch(r"[0-9a-f]{32}", m or "") for m in made) and made[0] != made[1]
