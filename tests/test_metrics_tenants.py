"""``/metrics`` and the dashboard break down by tenant and priority, with bounded label
values; the policy's failures and shed requests are counted."""

from __future__ import annotations

from typing import ClassVar

import aiohttp
from scripted_runner import ScriptedRunner
from server_support import base_url, metric, serve

from aioserve import AsyncEngine, EngineConfig, RequestMeta, RequestShedError, SamplingParams
from aioserve.dashboard.frames import FrameMaker
from aioserve.request import Request
from aioserve.scheduling import OrderedScheduler, SchedulerOutput
from aioserve.server import ServerConfig
from aioserve.server.tenant_labels import BoundedLabels

P = "aioserve:"


class ShedAds(OrderedScheduler):
    """Sheds the tenant "ads"; raises once on its 3rd decision."""

    name: ClassVar[str] = "shed_ads"
    calls = 0

    def schedule(self, state):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("one bad decision")
        shed = {r.request_id: "ads are over quota" for r in state.waiting if r.tenant == "ads"}
        decision = super().schedule(state)
        return SchedulerOutput(admit=[a for a in decision.admit if a not in shed], shed=shed)


async def generate(engine, tenant, priority, n=4):
    meta = RequestMeta(priority=priority, tenant=tenant)
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    try:
        return [t async for out in engine.generate("Once upon", params, meta=meta)
                for t in out.token_ids]
    except RequestShedError:
        return None


async def test_metrics_by_tenant_and_priority(tokenizer):
    engine = AsyncEngine(EngineConfig(model="scripted"), tokenizer=tokenizer,
                         runner=ScriptedRunner([300, 301, 302, 303]), scheduler=ShedAds())
    key = {"Authorization": "Bearer k"}  # raw tenant labels only behind the key
    async with serve(engine, ServerConfig(api_key="k")) as server, \
            aiohttp.ClientSession() as session:
        assert len(await generate(engine, "acme", 0)) == 4
        assert len(await generate(engine, "acme", 2, n=3)) == 3
        assert await generate(engine, "ads", 1) is None
        assert len(await generate(engine, None, 0, n=2)) == 2
        async with session.get(base_url(server) + "/metrics", headers=key) as response:
            text = await response.text()
    tokens = P + "tenant_generation_tokens_total"
    assert metric(text, tokens, 'priority="0",tenant="acme"') == 4
    assert metric(text, tokens, 'priority="2",tenant="acme"') == 3
    assert metric(text, tokens, 'priority="0",tenant="none"') == 2
    requests = P + "tenant_requests_total"
    assert metric(text, requests, 'finished_reason="error",priority="1",tenant="ads"') == 1
    assert metric(text, P + "tenant_time_to_first_token_seconds_count",
                  'priority="0",tenant="acme"') == 1
    assert metric(text, P + "num_requests_shed_total") == 1
    assert metric(text, P + "scheduler_failures_total") == 1


def test_label_values_are_bounded():
    labels = BoundedLabels(2)
    assert [labels(v) for v in ("a", None, "b", "a", "c")] == ["a", "none", "other", "a", "other"]


def test_frames_show_each_tenant():
    from aioserve.engine.observation import SlotState, StepSnapshot

    request = Request("r", [5, 6], SamplingParams(), 0.0)
    request.meta = RequestMeta(tenant="acme", priority=2)
    slot = SlotState.of(request)
    snapshot = StepSnapshot(1, 0.5, "fcfs", (slot, None), (), 3, 1, 8, 4, 0, 1,
                            (("acme", 1, 2), (None, 0, 1)))
    maker = FrameMaker("m")
    request.metrics.first_token_time = 0.2
    maker.record_finished(request)
    frame = maker.frame(snapshot)
    assert frame["slots"][0][8:] == ["acme", 2]
    assert frame["tenants"][0][:3] == ["acme", 1, 2] and frame["tenants"][0][3]["p50"] == 0.2
    assert frame["tenants"][1] == [None, 0, 1, None]


def test_snapshot_rows_keep_their_json_form():
    from aioserve.engine.observation import SlotState, StepSnapshot

    request = Request("r", [5, 6], SamplingParams(max_tokens=7), 0.0)
    request.meta = RequestMeta(tenant="acme", priority=2, metadata={"team": "ads"})
    slot = SlotState.of(request)
    data = StepSnapshot(1, 0.5, "fcfs", (slot, None), (slot,), 1, 1, 8, 4, 0, 1).to_json()
    assert data["slots"] == [["r", "prefill", 2, 0, 0, 7, 0, 0, "acme", 2], None]
    assert data["waiting"] == [["r", 0, "acme", 2]]
