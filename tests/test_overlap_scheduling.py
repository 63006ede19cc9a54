"""Overlapped scheduling: the core schedules step N+1 before step N's tokens are back,
and what users get does not change."""

from __future__ import annotations

import asyncio

import pytest
from scripted_runner import ScriptedRunner

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.engine.core import EngineCore
from aioserve.kv_cache import BlockManager
from aioserve.request import Request
from aioserve.runners.base import RunnerOutput, ScheduledBatch
from aioserve.scheduling.registry import load_scheduler


def make_core(num_blocks: int = 64, max_num_seqs: int = 4) -> EngineCore:
    return EngineCore(load_scheduler("fcfs"), BlockManager(num_blocks, 4, False),
                      max_num_seqs=max_num_seqs, max_num_batched_tokens=64, max_model_len=64,
                      eos_token_ids=(2,), clock=lambda: 0.0)


def add(core: EngineCore, request_id: str, prompt_len: int, max_tokens: int) -> Request:
    request = Request(request_id, [1] + [5] * (prompt_len - 1),
                      SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0)
    core.add(request)
    return request


def test_the_next_step_decodes_from_a_placeholder_before_the_tokens_return():
    core = make_core()
    add(core, "a", 6, 3)
    first = core.schedule()
    second = core.schedule()  # the first step is still in flight
    assert first is not None and second is not None
    assert [n.request_id for n in first.new_requests] == ["a"] and not second.new_requests
    assert (first.num_scheduled_tokens, first.sample) == ([6], [True])
    # the second step feeds position 6: the token the first step is sampling
    assert (second.start_positions, second.num_scheduled_tokens) == ([6], [1])
    assert second.num_output_tokens == [1]
    core.update(first, RunnerOutput([7]))
    core.update(second, RunnerOutput([8]))
    assert core.requests["a"].output_token_ids == [7, 8]


def test_a_request_whose_last_token_is_in_flight_is_not_scheduled_and_frees_its_slot():
    core = make_core(max_num_seqs=1)
    add(core, "a", 4, 1)
    add(core, "b", 4, 2)
    first = core.schedule()
    second = core.schedule()  # a's only token is in flight: b takes the slot
    assert first is not None and second is not None
    assert first.request_ids == ["a"] and second.request_ids == ["b"]
    assert core.requests["b"].metrics.first_scheduled_step == 1  # the step it runs in
    core.update(first, RunnerOutput([9]))
    third = core.schedule()
    assert third is not None and third.released_ids == ["a"]


def test_tokens_of_a_step_scheduled_before_a_preemption_are_dropped():
    core = make_core()
    request = add(core, "a", 6, 10)
    first = core.schedule()
    assert first is not None
    core.preempt(request)  # e.g. the policy evicts it while its step runs
    assert core.update(first, RunnerOutput([7])) == []
    assert request.output_token_ids == [] and request.num_computed_tokens == 0
    again = core.schedule()
    assert again is not None and again.released_ids == ["a"]
    assert [n.request_id for n in again.new_requests] == ["a"]  # recomputed from scratch
    assert again.num_scheduled_tokens == [6]


class OverlappedScripted(ScriptedRunner):
    """A scripted runner that ``overlaps``: the engine schedules one step ahead."""

    overlaps = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.max_steps_in_flight = 0
        self._running = 0

    def submit(self, batch: ScheduledBatch) -> asyncio.Future[RunnerOutput]:
        self._running += 1
        self.max_steps_in_flight = max(self.max_steps_in_flight, self._running)
        return asyncio.ensure_future(self._step(batch))

    async def _step(self, batch: ScheduledBatch) -> RunnerOutput:
        try:
            return await self.step(batch)
        finally:
            self._running -= 1


async def test_eos_and_max_tokens_under_overlap_give_exactly_the_script():
    scripts = {f"r{i}": [10 + i, 11, 12, 13, 2, 99, 98] for i in range(6)}
    runner = OverlappedScripted(lambda rid: scripts[rid])
    config = EngineConfig(model="scripted", max_num_seqs=3)
    async with AsyncEngine(config, runner=runner) as engine:

        async def run(i: int, ignore_eos: bool) -> tuple[list[int], str | None]:
            params = SamplingParams(max_tokens=6, ignore_eos=ignore_eos)
            tokens: list[int] = []
            reason = None
            async for out in engine.generate([1, 5, 6], params, request_id=f"r{i}"):
                tokens += out.token_ids
                reason = out.finish_reason
            return tokens, reason

        results = await asyncio.gather(*(run(i, i % 2 == 1) for i in range(6)))
    assert runner.max_steps_in_flight == 2
    for i, (tokens, reason) in enumerate(results):
        if i % 2:  # EOS ignored: max_tokens ends it
            assert (tokens, reason) == (scripts[f"r{i}"][:6], "length")
        else:  # the EOS id ends it; nothing sampled after it reaches the user
            assert (tokens, reason) == (scripts[f"r{i}"][:5], "stop")


@pytest.mark.parametrize(
    ("field", "value"), [("forward", "jit"), ("max_num_seqs", 0), ("dtype", "int8")]
)
def test_bad_engine_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"EngineConfig.{field}"):
        EngineConfig(model="m", **{field: value})


def test_unknown_attention_backend_is_refused_naming_the_option():
    import torch

    from aioserve.runners.attention.registry import backend_for

    with pytest.raises(ValueError, match="attention backend: 'fast' is not one of"):
        backend_for("fast", torch.device("cpu"))
