"""Prefix caching through the OpenAI API: ``usage.prompt_tokens_details.cached_tokens``
(completions and chat, streamed and not) and the ``/metrics`` prefix-cache counters."""

from __future__ import annotations

import aiohttp
import pytest
from server_support import CHAT_TEMPLATE, base_url, metric, scripted_engine, serve, sse_events

from aioserve.server import ServerConfig

P = "aioserve:"
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
        "in the park with her dog and her friends every day.")


async def usage_of(session, url: str, path: str, stream: bool, **body) -> dict:
    body = {"max_tokens": 3, "ignore_eos": True, **body}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    async with session.post(url + path, json=body) as r:
        assert r.status == 200
        if stream:
            return (await sse_events(r))[-2]["usage"]
        return (await r.json())["usage"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_repeated_prompt_reports_cached_tokens(tokenizer, path, stream):
    engine = scripted_engine(tokenizer, [300, 301, 302])
    body = ({"messages": [{"role": "user", "content": TEXT}]} if "chat" in path
            else {"prompt": TEXT})
    async with serve(engine, ServerConfig(chat_template=CHAT_TEMPLATE)) as server, \
            aiohttp.ClientSession() as s:
        url = base_url(server)
        first = await usage_of(s, url, path, stream, **body)
        second = await usage_of(s, url, path, stream, **body)
        async with s.get(url + "/metrics") as r:
            scraped = await r.text()
    prompt = first["prompt_tokens"]
    assert prompt > 32 and first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = (prompt - 1) // 16 * 16  # whole blocks of 16, the last token computed
    assert second["prompt_tokens_details"] == {"cached_tokens": cached}
    assert metric(scraped, P + "prefix_cache_queries_total") == 2 * prompt
    assert metric(scraped, P + "prefix_cache_hits_total") == cached


async def test_websocket_done_reports_cached_tokens(tokenizer):
    engine = scripted_engine(tokenizer, [300, 301, 302])
    usages = []
    async with serve(engine) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(base_url(server) + "/ws") as ws:
        for rid in ("a", "b"):
            await ws.send_json({"type": "generate", "id": rid, "prompt": TEXT,
                                "max_tokens": 2, "ignore_eos": True})
            while (message := await ws.receive_json())["type"] != "done":
                pass
            usages.append(message["usage"])
    prompt = usages[0]["prompt_tokens"]
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [
        0, (prompt - 1) // 16 * 16]
