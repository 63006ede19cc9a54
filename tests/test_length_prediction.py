"""No oracle by default, and a real output-length predictor (issue 31, items 1 and 2): a
policy sees only what a client sends (``max_tokens`` a cap, the stop hidden), the learned
predictor learns from finished requests and predicts what is left, its state survives a
restart, bad configuration is refused by name, and a predictor that raises is contained."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from scripted_runner import ScriptedRunner
from server_support import base_url, serve

from aioserve import AsyncEngine, EngineConfig
from aioserve.reports.figures import policy_figures
from aioserve.reports.lengths import kendall_tau, mean_absolute_error
from aioserve.request import Request
from aioserve.request_meta import RequestMeta
from aioserve.sampling_params import SamplingParams
from aioserve.scheduling import RequestView, SchedulerState
from aioserve.scheduling.registry import load_scheduler
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import routes
from schedulers.fcfs import FCFSScheduler
from schedulers.learned_length import LearnedLengthPredictor
from schedulers.length_predictor import LengthPredictor
from schedulers.spf import SPFScheduler

CONFIG = SimConfig(slots=8, step_ms=20, max_model_len=2048)


class Witness(FCFSScheduler):
    """FCFS that records what a policy is told of each request's length."""

    def __init__(self) -> None:
        super().__init__()
        self.told: dict[str, tuple[int, int | None]] = {}

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        self.told[request.request_id] = (request.params.max_tokens, request.params.length_hint)


async def test_no_policy_sees_the_true_length_and_the_hidden_stop_ends_each_request():
    workload = routes(n=120, rate=3.0)
    witness = Witness()
    result = await simulate(workload, witness, CONFIG)
    for item in workload:
        # the cap a client without a limit sends: the context left, not the length
        assert witness.told[item.id] == (2048 - item.prompt_len, None)
        finished = result.finished[item.id]
        assert finished.num_output_tokens == item.output_len
        assert finished.finish_reason is not None and finished.finish_reason.value == "stop"
    # a workload's own max_tokens is sent as it is, still a cap
    capped = [WorkloadRequest("a", 0.0, 8, 5, max_tokens=40)]
    witness = Witness()
    result = await simulate(capped, witness, CONFIG)
    assert witness.told["a"] == (40, None) and result.finished["a"].num_output_tokens == 5


def view(output_len: int = 0, prompt_len: int = 40, route: str = "chat",
         hint: int | None = None, request_id: str = "x") -> RequestView:
    request = Request(request_id, [5] * prompt_len,
                      SamplingParams(max_tokens=1000, length_hint=hint), 0.0)
    request.meta = RequestMeta(tenant="t", metadata={"route": route})
    request.output_token_ids = [7] * output_len
    return RequestView(request)


def teach(predictor: LearnedLengthPredictor, lengths: list[int], route: str = "chat") -> None:
    for i, length in enumerate(lengths):
        predictor.on_finish(view(route=route, request_id=f"{route}{i}"), length)


def test_the_learned_predictor_predicts_the_remaining_length():
    predictor = LearnedLengthPredictor(prior_weight=2)
    teach(predictor, [10] * 50 + [100] * 50)
    assert 50 <= predictor.remaining(view(0)) <= 60           # E[L] = 55
    assert 75 <= predictor.remaining(view(20)) <= 80          # E[L - 20 | L > 20] = 80
    assert predictor.predict(view(20)) == 20 + predictor.remaining(view(20))
    assert predictor.quantiles(view(0), (0.25, 0.9)) == (10, 100)
    assert predictor.remaining(view(0, hint=30)) == 30        # a client's hint wins
    # a young class leans on its parent: one 400-token sample moves it part of the way
    teach(predictor, [400], route="rare")
    rare = predictor.remaining(view(0, route="rare", request_id="y"))
    assert predictor.remaining(view(0)) < rare < 400


def test_the_state_round_trips_through_json(tmp_path):
    path = tmp_path / "lengths.json"
    first = LearnedLengthPredictor(state_path=str(path), save_every=10)
    teach(first, [12] * 10 + [300] * 10, route="a")
    assert path.exists()  # written every save_every finished requests
    restarted = LearnedLengthPredictor(state_path=str(path))
    for n in (0, 11, 200):
        assert restarted.remaining(view(n, route="a")) == first.remaining(view(n, route="a"))
    path.write_text('{"version": 1, "classes": {"*": [-3]}}')
    with pytest.raises(ValueError, match="state_path.*bad length -3"):
        LearnedLengthPredictor(state_path=str(path))


@pytest.mark.parametrize(("config", "named"), [
    ({"predictor": "learned", "predictor_config": {"window": 0}}, "window must be >= 1"),
    ({"predictor": "learned", "predictor_config": {"prior_weight": "x"}}, "prior_weight"),
    ({"predictor": "learned", "predictor_config": {"windw": 3}}, "no parameter 'windw'"),
    ({"predictor": "cap", "predictor_config": {"window": 3}}, "no parameter 'window'"),
    ({"predictor": "nowhere"}, "not one of hint, cap, oracle, learned, nor a"),
    ({"predictor": "no.where:X"}, "cannot import"),
])
def test_bad_predictor_configuration_is_refused_by_name(config, named):
    with pytest.raises(ValueError, match=named):
        load_scheduler("spf", config)


async def test_learning_pays_on_routes_and_the_oracle_is_labelled():
    workload = routes(n=500, rate=4.0)
    learned = policy_figures(await simulate(workload, "spf", CONFIG))
    assert learned["prediction_tau_after"] >= 0.5          # it learnt the routes' orders
    assert learned["prediction_tau_after"] > learned["prediction_tau"]  # and got better
    assert learned["prediction_mae"] is not None
    oracle = policy_figures(await simulate(workload, "spf", CONFIG,
                                           scheduler_params={"predictor": "oracle"}))
    assert oracle["scheduler"] == "spf (oracle: upper bound)"
    assert oracle["prediction_tau"] == 1.0 and oracle["prediction_mae"] == 0.0
    fcfs = policy_figures(await simulate(workload, "fcfs", CONFIG))
    assert fcfs["prediction_tau"] is None
    assert learned["mean_ttft_s"] < fcfs["mean_ttft_s"]


def test_kendall_tau_and_mae():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([3, 2, 1], [10, 20, 30]) == -1.0
    assert kendall_tau([1, 1, 1], [1, 2, 3]) is None
    assert mean_absolute_error([1, 5], [2, 2]) == 2.0


class Raising(LengthPredictor):
    def predict(self, request: RequestView) -> int:
        raise RuntimeError("predictor down")


async def test_a_raising_predictor_is_contained(caplog):
    workload = routes(n=40, rate=3.0)
    caplog.set_level(logging.WARNING)
    result = await simulate(workload, SPFScheduler(Raising()), CONFIG)
    assert len(result.finished) == 40                     # every request served
    assert result.core.guard.failures > 0                 # the failures counted
    assert "predictor down" in caplog.text                # and logged


async def test_memory_aware_reserves_by_the_cap():
    policy = load_scheduler("memory_aware")
    witness: list[int] = []
    original = policy.projected_blocks  # type: ignore[attr-defined]

    def projected(state: SchedulerState, request: RequestView) -> int:
        blocks = original(state, request)
        witness.append(blocks)
        return blocks

    policy.projected_blocks = projected  # type: ignore[attr-defined]
    await simulate([WorkloadRequest("a", 0.0, 16, 4)], policy, SimConfig(max_model_len=256))
    assert set(witness) == {256 // 16}                    # prompt + cap = the whole context


async def test_the_engine_stops_a_request_after_stop_after_tokens():
    runner = ScriptedRunner([300], max_model_len=128)     # never emits EOS
    async with AsyncEngine(EngineConfig(model="scripted"), runner=runner) as engine:
        stream = engine.add_request([5, 6, 7], SamplingParams(max_tokens=100), "r",
                                    stop_after=4)
        while not (await stream.queue.get()).finished:
            pass
        assert stream.request.num_output_tokens == 4
        assert stream.request.finish_reason is not None
        assert stream.request.finish_reason.value == "stop"
        assert stream.request.params.max_tokens == 100    # the policy still sees the cap
        with pytest.raises(ValueError, match="stop_after must be an integer >= 1"):
            engine.add_request([5], SamplingParams(max_tokens=4), "bad", stop_after=0)


async def test_the_hidden_stop_over_http_and_the_websocket(tokenizer):
    engine = AsyncEngine(EngineConfig(model="scripted", scheduler="spf"),
                         runner=ScriptedRunner([300]), tokenizer=tokenizer)
    body = {"prompt": [5, 6, 7], "max_tokens": 50}
    async with serve(engine) as server, aiohttp.ClientSession() as session:
        url = base_url(server)
        async with session.post(url + "/v1/completions", json=body,
                                headers={"X-Stop-After": "3"}) as response:
            answer = await response.json()
        assert answer["usage"]["completion_tokens"] == 3
        assert answer["choices"][0]["finish_reason"] == "stop"
        async with session.get(url + "/metrics") as response:
            metrics = await response.text()
        # spf predicted it (nothing learnt yet: the prior, 128) and it generated 3
        assert 'aioserve:request_output_length_tokens_sum{source="actual"} 3.0' in metrics
        assert 'aioserve:request_output_length_tokens_sum{source="predicted"} 128.0' in metrics
        assert "aioserve:output_length_prediction_error_tokens_sum 125.0" in metrics
        for bad in ("0", "three", "-2", "\u0663", "\u00b2"):  # non-ASCII digits: "3", "2"
            async with session.post(url + "/v1/completions", json=body,
                                    headers={"X-Stop-After": bad}) as response:
                assert response.status == 400
                assert (await response.json())["error"]["param"] == "X-Stop-After"
        async with session.ws_connect(url + "/ws") as ws:
            await ws.send_json({"type": "generate", "id": "w", "prompt": [5, 6],
                                "max_tokens": 50, "stop_after": 2})
            while (message := await ws.receive_json())["type"] != "done":
                pass
            assert message["usage"]["completion_tokens"] == 2


async def test_real_replay_stops_each_request_by_stop_after_and_keeps_each_policy(model_dir):
    from aioserve.sim.real import replay

    workload = [WorkloadRequest(f"w{i}", 0.01 * i, 8 + i, 3 + i) for i in range(6)]
    async with AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=4)) as engine:
        fcfs = await replay(engine, workload, "fcfs")
        spf = await replay(engine, workload, "spf")
    for result in (fcfs, spf):
        assert {k: r.num_output_tokens for k, r in result.finished.items()} == {
            w.id: w.output_len for w in workload}
        assert {r.finish_reason.value for r in result.finished.values()
                if r.finish_reason is not None} == {"stop"}
    # each run's figures are its own policy's, though the engine now runs spf
    assert policy_figures(fcfs)["prediction_mae"] is None
    assert policy_figures(spf)["prediction_mae"] is not None
