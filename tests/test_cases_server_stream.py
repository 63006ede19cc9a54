"""CASES.md server cases about what a stream carries: BUG-16 (stop strings), BUG-18
(UTF-8 across tokens), BUG-20 (n>1 chunk indexes), BUG-21 (EOS / stop ids), on a
scripted model with the real tokenizer, over SSE, plain JSON and the websocket."""

from __future__ import annotations

import aiohttp
import pytest
from server_support import CHAT_TEMPLATE, base_url, scripted_engine, serve, sse_events

from aioserve.server import ServerConfig

PROMPT = "Letters:"


def letters(tokenizer, text: str) -> list[int]:
    """One token per letter (the test tokenizer has a token for each capital)."""
    ids = [tokenizer.convert_tokens_to_ids(ch) for ch in text]
    assert tokenizer.unk_token_id not in ids
    return ids


async def complete(session, url, **body) -> tuple[str, str, int]:
    async with session.post(url + "/v1/completions", json={"prompt": PROMPT, **body}) as r:
        assert r.status == 200, await r.text()
        data = await r.json()
    choice = data["choices"][0]
    return choice["text"], choice["finish_reason"], data["usage"]["completion_tokens"]


async def stream(session, url, path="/v1/completions", **body) -> list:
    payload = {"prompt": PROMPT, **body, "stream": True}
    async with session.post(url + path, json=payload) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        return await sse_events(r)


def texts(events) -> list[str]:
    return [c["text"] for e in events if e != "[DONE]" for c in e["choices"]]


async def ws_run(session, url, **message) -> tuple[list[str], dict]:
    async with session.ws_connect(url + "/ws") as ws:
        await ws.send_json({"type": "generate", "id": "a", "prompt": PROMPT, **message})
        deltas = []
        async for msg in ws:
            data = msg.json()
            if data["type"] == "token":
                deltas.append(data["text"])
            else:
                return deltas, data
    raise AssertionError("socket closed early")


async def test_bug16_stop_string_split_across_tokens_never_leaks(tokenizer):
    script = letters(tokenizer, "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    async with serve(scripted_engine(tokenizer, script)) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        body = {"max_tokens": 20, "stop": ["DEFGHIJ"]}
        text, reason, _ = await complete(s, url, **body)
        assert (text, reason) == ("ABC", "stop")
        events = await stream(s, url, **body)
        chunks = texts(events)
        assert "".join(chunks) == "ABC"
        assert not any(set(chunk) & set("DEFGHIJ") for chunk in chunks)
        assert [c["finish_reason"] for e in events[:-1] for c in e["choices"]][-1] == "stop"
        deltas, done = await ws_run(s, url, **body)
        assert "".join(deltas) == "ABC" and done["finish_reason"] == "stop"

        body["include_stop_str_in_output"] = True
        text, reason, _ = await complete(s, url, **body)
        assert (text, reason) == ("ABCDEFGHIJ", "stop")
        assert "".join(texts(await stream(s, url, **body))) == "ABCDEFGHIJ"


async def test_bug18_multibyte_characters_split_across_byte_tokens(tokenizer):
    script = tokenizer("ok 🦙 世界!", add_special_tokens=False).input_ids
    byte_tokens = [t for t in script if tokenizer.convert_ids_to_tokens(t).startswith("<0x")]
    assert len(byte_tokens) == 10  # the emoji spans 4 byte tokens, each CJK character 3
    prompt_ids = tokenizer(PROMPT).input_ids
    full = tokenizer.decode(prompt_ids + script, skip_special_tokens=True)
    expected = full[len(tokenizer.decode(prompt_ids, skip_special_tokens=True)):]
    assert expected.endswith("ok 🦙 世界!")
    n = len(script)
    async with serve(scripted_engine(tokenizer, script)) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        events = await stream(s, url, max_tokens=n)
        chunks = texts(events)
        assert "".join(chunks) == expected
        assert not any("\ufffd" in chunk for chunk in chunks)
        deltas, done = await ws_run(s, url, max_tokens=n)
        assert "".join(deltas) == expected and not any("\ufffd" in d for d in deltas)
        assert done["usage"]["completion_tokens"] == n
        text, _, _ = await complete(s, url, max_tokens=n)
        assert text == expected

        cut = 5  # "▁o", "k", "▁", then the emoji's first two bytes
        streamed = "".join(texts(await stream(s, url, max_tokens=cut)))
        whole, reason, tokens = await complete(s, url, max_tokens=cut)
        deltas, _ = await ws_run(s, url, max_tokens=cut)
        cut_full = tokenizer.decode(prompt_ids + script[:cut], skip_special_tokens=True)
        cut_text = cut_full[len(tokenizer.decode(prompt_ids, skip_special_tokens=True)):]
        assert cut_text.startswith(" ok \ufffd")  # incomplete bytes: the tokenizer's U+FFFD
        assert streamed == whole == "".join(deltas) == cut_text
        assert (reason, tokens) == ("length", cut)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_bug20_choice_indexes_and_one_finish_per_choice(tokenizer, path):
    engine = scripted_engine(tokenizer, letters(tokenizer, "ABCDEFGH"))
    config = ServerConfig(chat_template=CHAT_TEMPLATE)
    async with serve(engine, config) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        extra = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {}
        for n in (2, 1):
            events = await stream(s, url, path, n=n, max_tokens=5, temperature=0.8, seed=3,
                                  **extra)
            assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
            choices = [c for e in events[:-1] for c in e["choices"]]
            assert {c["index"] for c in choices} == set(range(n))
            finishes = [c for c in choices if c["finish_reason"] is not None]
            assert sorted(c["index"] for c in finishes) == list(range(n))
            assert all(c["finish_reason"] == "length" for c in finishes)
            for index in range(n):  # the finish chunk is the last of its index
                assert [c for c in choices if c["index"] == index][-1]["finish_reason"]


async def test_bug21_eos_and_stop_token_ids_end_the_text(tokenizer):
    hi = tokenizer("Hi", add_special_tokens=False).input_ids
    eos = tokenizer.eos_token_id
    end_of_turn = tokenizer.convert_tokens_to_ids("Q")
    after = letters(tokenizer, "XYZ")

    def script(request_id: str) -> list[int]:
        return hi + ([end_of_turn] if "turn" in request_id else [eos]) + after

    async with serve(scripted_engine(tokenizer, script)) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        text, reason, tokens = await complete(s, url, max_tokens=10)
        assert (text, reason, tokens) == (" Hi", "stop", 3)  # EOS counted, not shown
        events = await stream(s, url, max_tokens=10, stream_options={"include_usage": True})
        assert "".join(texts(events)) == " Hi"
        assert events[-2]["usage"]["completion_tokens"] == 3
        deltas, done = await ws_run(s, url, max_tokens=10)
        assert "".join(deltas) == " Hi" and done["finish_reason"] == "stop"

        body = {"max_tokens": 10, "stop_token_ids": [end_of_turn], "request_id": "turn"}
        assert await complete(s, url, **body) == (" Hi", "stop", 3)
        body["request_id"] = "turn2"
        assert "".join(texts(await stream(s, url, **body))) == " Hi"

        text, reason, tokens = await complete(s, url, max_tokens=6, ignore_eos=True)
        assert (reason, tokens) == ("length", 6)
        assert text == " HiXYZ"  # EOS ignored (and shows no text), then the script goes on
