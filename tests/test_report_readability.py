"""Issue 34, item 5: reports a reader can trust at a glance: units in every header, value
axes from zero, one time axis across timelines, per-tenant panels, each table once in
the HTML, titles from the workload run, and ITL gaps per network read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import matplotlib.pyplot as plt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from aioserve.bench.online.serving import RequestRecord, send_completion, sse_reads
from aioserve.reports.compare import (
    COLUMNS,
    comparison_figure,
    comparison_tables,
    format_comparison,
    write_comparison_html,
)
from aioserve.reports.figures import policy_figures
from aioserve.reports.outcome import Outcome
from aioserve.reports.plots import timeline_figure
from aioserve.reports.report import format_report, summarize
from aioserve.reports.serving_plots import run_title, serving_figure
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.scenarios import load_workload
from aioserve.workloads.synthetic import token_request

#: Headers without a unit: names, a percentage, an index (0-1) and counts.
UNITLESS = {"policy", "SLO %", "Jain", "preemptions", "recomputed tok", "length tau",
            "prefix hit %"}


async def _runs(workload: str, names: tuple[str, ...]) -> list:
    items = load_workload(workload)
    return [await simulate(items, name, SimConfig(slots=4)) for name in names]


@pytest.fixture(scope="module")
def tenant_runs() -> list[dict]:
    results = asyncio.run(_runs("two-tenants:n=40,rate=20", ("fcfs", "vtc")))
    return [policy_figures(r) for r in results]


def test_every_table_header_carries_its_unit(tenant_runs):
    results = asyncio.run(_runs("article-example", ("fcfs",)))
    head = format_report(summarize(results[0], "article-example")).splitlines()[1]
    assert head.split() == ["id", "status", "arrival", "(s)", "TTFT", "(s)", "finish", "(s)",
                            "latency", "(s)", "tokens", "preempt", "article", "(s)"]
    for _, header, _, _ in COLUMNS:
        units = ("(s)", "(ms)", "/s", "(steps)", "(tokens)")
        assert header in UNITLESS or header.endswith(units), header
    text = format_comparison(tenant_runs)
    for header in ("TTFT p50", "TPOT ms", "E2E p99", "tok/s", "goodput/s",
                   "TTFT, E2E in s", "mean TTFT (s) / p99 TTFT (s)"):
        assert header in text
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["policy", "goodput/s", "SLO"]  # the answer first
    assert max(map(len, lines[: len(tenant_runs) + 4])) <= 100  # issue 48 item 2


def test_html_shows_each_table_once(tenant_runs, tmp_path):
    tables = comparison_tables(tenant_runs)
    assert [t.title.split(":")[0] for t in tables] == ["policies", "per tenant"]
    page = write_comparison_html(tenant_runs, tmp_path / "r.html", "t").read_text()
    assert page.count("<table") == len(tables) == page.count("<section><h2>") - 1  # + plots
    assert page.count("TTFT p50 (s)") == 1 and page.count("<td>vtc</td>") == len(tables)
    assert "<pre>" not in page


def test_comparison_axes_start_at_zero_with_a_panel_per_tenant(tenant_runs):
    fig = comparison_figure(tenant_runs, "two tenants")
    try:
        assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)  # the goodput twin too
        titles = [ax.get_title() for ax in fig.axes]
        assert "mean TTFT per tenant" in titles
        assert all(ax.get_ylabel() for ax in fig.axes)
        assert fig.get_suptitle() == "two tenants"
    finally:
        plt.close(fig)
    one = [policy_figures(r) for r in asyncio.run(_runs("article-example", ("fcfs",)))]
    fig = comparison_figure(one)
    try:
        assert "mean TTFT per tenant" not in [ax.get_title() for ax in fig.axes]
    finally:
        plt.close(fig)


def test_slot_timelines_share_one_time_axis_from_zero():
    """The longest run is drawn whole wherever it comes (the axis took the first run's span:
    a slower policy listed later was cut off)."""
    results = asyncio.run(_runs("article-mix", ("fcfs", "static")))
    fig = timeline_figure(results, [summarize(r) for r in results], "simulated: article-mix")
    try:
        assert fig.get_suptitle() == "simulated: article-mix"
        fcfs, static, cdf = fig.axes
        assert static.get_xlim() == fcfs.get_xlim() and static.get_xlim()[0] == 0
        assert max(s.end_s for s in results[1].steps) > max(s.end_s for s in results[0].steps)
        assert static.get_xlim()[1] >= max(s.end_s for s in results[1].steps)  # the longer
        assert cdf.get_xlabel() == "latency (s)" and cdf.get_ylim()[0] == 0
    finally:
        plt.close(fig)


def _record(tenant: str, start: float, ttft: float) -> Outcome:
    times = (start + ttft, start + ttft + 0.1, start + ttft + 0.3)
    return Outcome(tenant, start, 4, 3, times[0], times[-1], times[-1], tenant=tenant,
                   token_times=times)


def test_serving_plot_titles_the_workload_run_and_splits_tenants():
    title = run_title("w.jsonl", [0.0, 0.5, 1.0], "completions")
    assert title == "w.jsonl: 3 requests, 2.00 req/s mean arrival rate, completions"
    assert "all at once" in run_title("random prompts", [0.0, 0.0], "ws")
    fig = serving_figure([_record("a", 0.0, 0.1), _record("b", 0.5, 0.4)], title)
    try:
        assert fig.get_suptitle() == title and "inf" not in title
        ttft = fig.axes[0]
        assert [t.get_text() for t in ttft.get_legend().get_texts()] == ["a", "b"]
        assert all(ax.get_xlim()[0] == 0 for ax in fig.axes)
        assert "reads that carried tokens" in fig.axes[2].get_xlabel()
    finally:
        plt.close(fig)


async def _blocks(*blocks: bytes) -> AsyncIterator[bytes]:
    for block in blocks:
        yield block


async def test_events_read_together_arrive_together():
    reads = [group async for group in sse_reads(_blocks(
        b'data: {"a": 1}\n\ndata: {"a": 2}\n\ndata: {"a',  # two events and half a third
        b'": 3}\n\n', b": keep-alive\n\n", b"data: [DONE]\n\n"))]
    assert reads == [['{"a": 1}', '{"a": 2}'], ['{"a": 3}'], ["[DONE]"]]


async def test_tokens_in_one_read_make_no_zero_ms_gaps():
    """A server that writes three token events in one write: one arrival, no ITL gap."""
    events = [b'data: {"choices": [{"text": "%d", "finish_reason": null}]}\n\n' % i
              for i in range(3)]
    events.append(b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n'
                  b"data: [DONE]\n\n")

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"".join(events))
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        import aiohttp

        record = RequestRecord()
        request = token_request(0, [1, 2, 3, 4], 3)
        async with aiohttp.ClientSession() as session:
            await asyncio.wait_for(send_completion(
                session, str(server.make_url("")).rstrip("/"), None, record, request,
                [1, 2, 3, 4]), 30)
    finally:
        await server.close()
    outcome = record.outcome(request, 0.0)
    assert outcome.ok and outcome.output_tokens == 3
    assert len(outcome.token_times) == 1 and outcome.itl == []
