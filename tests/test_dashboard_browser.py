"""Issue 13: the dashboard in a real browser (headless Chromium driven by Playwright)
against a real server on 127.0.0.1 under load: the slots it shows are the engine's.

Skipped, with the reason, only where Chromium or Playwright cannot be found. Set
``AIOSERVE_DASHBOARD_SCREENSHOT=docs/dashboard.png`` to save the page as it shows the
held engine.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import aiohttp
import pytest
import pytest_asyncio
from server_support import GatedRunner, base_url, idle, scripted_engine, serve, wait_until

from aioserve import AsyncEngine, EngineConfig
from aioserve.cli import main
from aioserve.scheduling.registry import available_schedulers
from aioserve.server import ServerConfig
from aioserve.server.policy_report import policy_report

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
SLOTS = 6


def chromium_path() -> str:
    """Debian's chromium (or $AIOSERVE_CHROMIUM); skips the test when there is none."""
    path = os.environ.get("AIOSERVE_CHROMIUM") or shutil.which("chromium") or (
        shutil.which("chromium-browser"))
    if not path:
        pytest.skip("chromium not found: install Debian's 'chromium' package "
                    "(apt-get install -y chromium) or set AIOSERVE_CHROMIUM")
    return path


#: What the page shows of its slots: step, scheduler, slots, queue, running count.
SLOTS_VIEW = """() => ({
    step: Number(document.body.dataset.step),
    scheduler: document.body.dataset.scheduler,
    slots: [...document.querySelectorAll('#slots .slot')].map(r => ({
        slot: Number(r.dataset.slot), id: r.dataset.requestId || null,
        phase: r.dataset.phase})),
    queue: [...document.querySelectorAll('#queue .queued')].map(c => c.dataset.requestId),
    running: document.getElementById('running').textContent,
})"""

#: What the page shows of the policy's report: step, scheduler, the panel, rows by name.
REPORT_VIEW = """() => ({
    step: Number(document.body.dataset.step),
    scheduler: document.body.dataset.scheduler,
    panel: document.getElementById('policy-report') !== null,
    rows: Object.fromEntries([...document.querySelectorAll('#policy-report .report')]
        .map(r => [r.dataset.name, r.textContent])),
})"""


async def page_shows(page, ready, timeout: float = 10.0, view: str = SLOTS_VIEW) -> dict:
    """Poll what the page shows (``view``'s object) until ``ready(shown)`` holds; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        shown = await page.evaluate(view)
        if ready(shown):
            return shown
        assert time.monotonic() < deadline, f"page stuck at step {shown['step']}: {shown}"
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def browser():
    """Headless Chromium, driven by Playwright."""
    executable = chromium_path()
    playwright_api = pytest.importorskip("playwright.async_api",
                                         reason="pip install playwright (the dev extra)")
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            await browser.close()


async def test_dashboard_in_chromium_shows_the_engines_slots(tokenizer, browser):
    runner = GatedRunner([300, 301, 302], num_kv_blocks=128, delay=0.005)
    engine = AsyncEngine(EngineConfig(model="scripted", max_num_seqs=SLOTS), runner=runner,
                         tokenizer=tokenizer)
    body = {"model": "scripted", "prompt": "Once upon a time, a little girl",
            "max_tokens": 400, "ignore_eos": True}
    async with serve(engine, ServerConfig(stats_interval=0.0)) as server, \
            aiohttp.ClientSession() as http:
        url = base_url(server)
        page = await browser.new_page(viewport={"width": 1200, "height": 640})
        other = await browser.new_page()  # a second viewer of the same server
        for viewer in (page, other):
            await viewer.goto(url + "/dashboard")
            await viewer.wait_for_selector("body[data-connected=true]", timeout=10_000)
        load = [asyncio.create_task(http.post(url + "/v1/completions", json=body))
                for _ in range(SLOTS + 3)]
        await wait_until(lambda: engine.stats()["num_waiting"] == 3, timeout=10)
        await wait_until(lambda: engine.core.step_count >= 20, timeout=10)
        runner.gate.clear()
        await wait_until(lambda: runner.at_gate, timeout=10)  # quiescent
        now = engine.snapshot()
        shown = await page_shows(page, lambda shown: shown["step"] == now.step)
        assert await page_shows(other, lambda shown: shown["step"] == now.step) == shown
        assert shown["scheduler"] == "fcfs" and len(shown["slots"]) == SLOTS
        assert [s["id"] for s in shown["slots"]] == [s and s.request_id for s in now.slots]
        assert {s["id"] for s in shown["slots"]} == {r.request_id for r in engine.core.running}
        assert [s["phase"] for s in shown["slots"]] == [s.phase for s in now.slots]
        assert shown["queue"] == [r.request_id for r in engine.core.waiting]
        assert shown["running"] == str(SLOTS)
        shot = os.environ.get("AIOSERVE_DASHBOARD_SCREENSHOT")
        if shot:
            await page.screenshot(path=shot, full_page=True)
        for task in load:
            task.cancel()
        runner.gate.set()
        await asyncio.gather(*load, return_exceptions=True)
        await wait_until(lambda: idle(engine), timeout=10)
        shown = await page_shows(page, lambda shown: shown["running"] == "0")
        assert all(s["id"] is None and s["phase"] == "free" for s in shown["slots"])
        assert shown["queue"] == [] and shown["step"] == engine.snapshot().step


@pytest.mark.parametrize("name", available_schedulers())
async def test_live_page_and_metrics_show_each_builtin_policys_report(tokenizer, browser, name):
    # Issue 50: the report() panel updates with the slots and /metrics exports the same
    # entries, for every built-in policy (fcfs, static and memory_aware report nothing:
    # an empty panel and no sample)
    runner = GatedRunner([300, 301, 302], num_kv_blocks=128, delay=0.005)
    engine = AsyncEngine(EngineConfig(model="scripted", max_num_seqs=4, scheduler=name),
                         runner=runner, tokenizer=tokenizer)
    async with serve(engine, ServerConfig(stats_interval=0.0)) as server, \
            aiohttp.ClientSession() as http:
        url = base_url(server)
        page = await browser.new_page()
        await page.goto(url + "/dashboard")
        await page.wait_for_selector("body[data-connected=true]", timeout=10_000)
        load = [asyncio.create_task(http.post(url + "/v1/completions", json={
            "model": "scripted", "prompt": "Once upon a time", "max_tokens": 200,
            "ignore_eos": True, "user": "ab"[i % 2]})) for i in range(6)]
        await wait_until(lambda: engine.core.step_count >= 10, timeout=10)
        runner.gate.clear()
        await wait_until(lambda: runner.at_gate, timeout=10)  # quiescent
        step = engine.snapshot().step
        _, report = policy_report(engine)
        shown = await page_shows(page, lambda shown: shown["step"] == step,
                                  view=REPORT_VIEW)
        assert shown["scheduler"] == name and shown["panel"]
        assert set(shown["rows"]) == set(report)
        for entry, value in report.items():
            assert shown["rows"][entry].startswith(f"{entry}: ")
            if isinstance(value, dict):  # each key of a keyed entry, tenants included
                assert all(f"{key} " in shown["rows"][entry] for key in value)
        async with http.get(url + "/metrics") as response:
            text = await response.text()
        assert "# TYPE aioserve:policy_report gauge" in text
        samples = [line for line in text.splitlines()
                   if line.startswith("aioserve:policy_report{")]
        exported = {line.split('name="')[1].split('"')[0] for line in samples
                    if f'policy="{name}"' in line}
        assert exported == {e for e, v in report.items() if not isinstance(v, dict) or v}
        for task in load:
            task.cancel()
        runner.gate.set()
        await asyncio.gather(*load, return_exceptions=True)
        await wait_until(lambda: idle(engine), timeout=10)


async def test_dashboard_asks_for_the_key_once_and_keeps_it_out_of_urls(tokenizer, browser):
    """Issue 52: with a key the page shows a form (no retry loop), a wrong key is said so,
    the right one opens the live feed through an HttpOnly SameSite=Strict cookie, and no
    URL the page requests carries the key."""
    key = "sk-browser-52"
    async with serve(scripted_engine(tokenizer, [300]), ServerConfig(api_key=key)) as server:
        page = await browser.new_page()
        urls: list[str] = []
        page.on("request", lambda request: urls.append(request.url))
        await page.goto(base_url(server) + "/")
        await page.wait_for_selector("#login", state="visible", timeout=10_000)
        assert await page.evaluate("document.body.dataset.connected") == "false"
        await page.fill("#api-key", "wrong")
        await page.click("#login button[type=submit]")
        await page.wait_for_function(
            "document.getElementById('login-error').textContent === 'wrong key'",
            timeout=10_000)
        await page.fill("#api-key", key)
        await page.click("#login button[type=submit]")
        await page.wait_for_selector("body[data-connected=true]", timeout=10_000)
        assert await page.is_hidden("#login")
        assert not [url for url in urls if "api_key" in url or key in url], urls
        [cookie] = [c for c in await page.context.cookies() if c["name"] == "aioserve_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and key not in cookie["value"]


async def test_simulate_html_replays_and_switches_policy_in_chromium(tmp_path, browser):
    path = tmp_path / "report.html"
    argv = ["simulate", "--scheduler", "fcfs,spf", "--workload", "article-mix",
            "--kv-blocks", "12", "--html", str(path)]
    assert await asyncio.to_thread(main, argv) == 0  # main runs its own event loop
    page = await browser.new_page(viewport={"width": 1200, "height": 640})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(path.as_uri())
    shown = await page_shows(page, lambda shown: shown["step"] == 1)
    assert shown["scheduler"] == "fcfs" and len(shown["slots"]) == 4
    assert all(s["id"] for s in shown["slots"])  # the article's burst fills every slot
    last = int(await page.get_attribute("#slider", "max"))
    await page.evaluate("""(v) => { const s = document.getElementById('slider');
        s.value = v; s.dispatchEvent(new Event('input')); }""", str(last))
    shown = await page_shows(page, lambda shown: shown["step"] == last + 1)
    assert all(s["phase"] == "free" for s in shown["slots"])
    await page.select_option("#policy", "spf")
    shown = await page_shows(page, lambda shown: shown["scheduler"] == "spf")
    assert await page.evaluate("document.body.dataset.policy") == "spf"
    assert errors == []
