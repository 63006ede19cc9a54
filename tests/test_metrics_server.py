"""``GET /metrics``: counters move by exactly the tokens generated (CASES BUG-10), under
preemption too; 1-token requests have no inter-token latency (BUG-13); apps have
separate registries."""

from __future__ import annotations

import asyncio

import aiohttp
from server_support import base_url, idle, metric, scripted_engine, serve, sse_events, wait_until

from aioserve.request import RequestMetrics
from aioserve.server.metrics import RequestLatencies

P = "aioserve:"


async def scrape(session, url) -> str:
    async with session.get(url + "/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        return await r.text()


async def test_bug10_usage_stream_and_metrics_agree(tokenizer):
    prompt = "Once upon a time"
    async with serve(scripted_engine(tokenizer, [300, 301, 2])) as server, \
            aiohttp.ClientSession() as s:
        url = base_url(server)
        before = await scrape(s, url)
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                     "prompt_tokens_total", "generation_tokens_total", "num_preemptions_total",
                     "time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
                     "e2e_request_latency_seconds_count", "request_queue_time_seconds_count"):
            assert f"\n{P}{name} " in before, name
        body = {"prompt": prompt, "max_tokens": 20, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        async with s.post(url + "/v1/completions", json=body) as r:
            events = await sse_events(r)
        usages = [e for e in events if e != "[DONE]" and "usage" in e]
        assert len(usages) == 1 and usages[0] is events[-2] and usages[0]["choices"] == []
        token_events = [c for e in events[:-2] for c in e["choices"] if c["finish_reason"] is None]
        assert usages[0]["usage"]["completion_tokens"] == 20 == len(token_events)
        assert usages[0]["usage"]["prompt_tokens"] == len(tokenizer(prompt).input_ids)
        for options in (None, {}):  # no usage unless asked
            extra = {} if options is None else {"stream_options": options}
            body = {"prompt": prompt, "max_tokens": 3, "stream": True, **extra}
            async with s.post(url + "/v1/completions", json=body) as r:
                assert not any("usage" in e for e in await sse_events(r) if e != "[DONE]")
        async with s.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 20,
                                                         "ignore_eos": True}) as r:
            assert (await r.json())["usage"]["completion_tokens"] == 20
        after = await scrape(s, url)
        gen = P + "generation_tokens_total"
        assert metric(after, gen) - metric(before, gen) == 20 + 3 + 3 + 20
        prompt_total = P + "prompt_tokens_total"
        assert metric(after, prompt_total) - metric(before, prompt_total) == 4 * 5
        success = P + "request_success_total"
        assert metric(after, success, 'finished_reason="length"') == 2  # the 20-token ones
        assert metric(after, success, 'finished_reason="stop"') == 2  # EOS as third token
        assert metric(after, P + "e2e_request_latency_seconds_count") == 4
        assert metric(after, P + "inter_token_latency_seconds_count") == 19 + 2 + 2 + 19


async def test_bug10_preempted_tokens_are_counted_once(tokenizer):
    engine = scripted_engine(tokenizer, [300, 301], num_kv_blocks=8, block_size=4)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        prompt = tokenizer("Once upon a time", add_special_tokens=False).input_ids[:6]
        prompt = (prompt * 2)[:6]
        body = {"prompt": prompt, "max_tokens": 20, "ignore_eos": True}
        async def one():
            async with s.post(url + "/v1/completions", json=body) as r:
                return (await r.json())["usage"]["completion_tokens"]

        counts = await asyncio.gather(one(), one(), one())
        assert counts == [20, 20, 20]
        text = await scrape(s, url)
        assert metric(text, P + "num_preemptions_total") >= 1  # precondition
        assert metric(text, P + "generation_tokens_total") == 60
        assert metric(text, P + "kv_cache_usage_perc") == 0
        assert idle(engine)


async def test_running_gauges_and_live_token_counter(tokenizer):
    engine = scripted_engine(tokenizer, [300], max_model_len=100_000, num_kv_blocks=8000)
    async with serve(engine) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        r = await s.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 90_000,
                                                        "stream": True})
        await r.content.readline()
        text = await scrape(s, url)
        assert metric(text, P + "num_requests_running") == 1
        assert 0 < metric(text, P + "kv_cache_usage_perc") <= 1
        assert metric(text, P + "generation_tokens_total") >= 1  # counted while running
        r.close()
        await wait_until(lambda: idle(engine))
        text = await scrape(s, url)
        assert metric(text, P + "request_success_total", 'finished_reason="abort"') == 1
        # one token per step, but a step that ran while the abort came is not kept
        steps = engine.runner.steps
        assert steps - 1 <= metric(text, P + "generation_tokens_total") <= steps


async def test_bug13_one_token_request_has_ttft_but_no_inter_token_latency(tokenizer):
    async with serve(scripted_engine(tokenizer, [300])) as server, aiohttp.ClientSession() as s:
        url = base_url(server)
        async with s.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}) as r:
            assert (await r.json())["usage"]["completion_tokens"] == 1
        text = await scrape(s, url)
        assert metric(text, P + "time_to_first_token_seconds_count") == 1
        assert metric(text, P + "inter_token_latency_seconds_count") == 0
        assert metric(text, P + "request_time_per_output_token_seconds_count") == 0
    one = RequestMetrics(arrival_time=1.0, first_scheduled_time=1.5, first_token_time=2.0,
                         last_token_time=2.0, finished_time=2.0)
    lat = RequestLatencies.of(one, 1)
    assert lat.time_per_output_token is None and lat.time_to_first_token == 1.0
    assert lat.queue_time == 0.5 and lat.e2e == 1.0
    many = RequestMetrics(arrival_time=0.0, first_token_time=1.0, last_token_time=3.0)
    assert RequestLatencies.of(many, 5).time_per_output_token == 0.5


async def test_two_apps_in_one_process_have_separate_registries(tokenizer):
    async with serve(scripted_engine(tokenizer, [300])) as a, \
            serve(scripted_engine(tokenizer, [300])) as b, aiohttp.ClientSession() as s:
        async with s.post(base_url(a) + "/v1/completions",
                          json={"prompt": "hi", "max_tokens": 3}) as r:
            assert r.status == 200
        assert metric(await scrape(s, base_url(a)), P + "generation_tokens_total") == 3
        assert metric(await scrape(s, base_url(b)), P + "generation_tokens_total") == 0
