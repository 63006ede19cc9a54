"""Engine overhead: the step loop's own cost per step on a runner that costs nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from aioserve.config import EngineConfig
from aioserve.engine import AsyncEngine
from aioserve.runners.base import ModelRunner, RunnerOutput, ScheduledBatch
from aioserve.sampling_params import SamplingParams


class NullRunner(ModelRunner):
    """Returns ``token_id`` for every sampled row at no cost, yielding once per step; the
    engine overlaps its steps as with a real runner."""

    overlaps = True

    def __init__(self, *, max_model_len: int = 4096, token_id: int = 300) -> None:
        self.num_kv_blocks = 8192
        self.block_size = 16
        self.max_model_len = max_model_len
        self.eos_token_ids: tuple[int, ...] = (2,)
        self.vocab_size = 512
        self._token = token_id

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        await asyncio.sleep(0)
        token = self._token
        return RunnerOutput(token_ids=[token if s else -1 for s in batch.sample])


@dataclass(frozen=True)
class OverheadResult:
    """Microseconds per steady decode step, split into the loop's parts."""

    num_requests: int
    num_steps: int
    step_us: float
    schedule_us: float
    update_us: float
    fan_out_us: float
    loop_us: float
    other_us: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"{self.num_requests} requests, {self.num_steps} steps: {self.step_us:.1f} us/step "
            f"(schedule {self.schedule_us:.1f}, update {self.update_us:.1f}, "
            f"fan-out {self.fan_out_us:.1f}; loop {self.loop_us:.1f}, other {self.other_us:.1f})"
        )


def _timed(func: Callable[..., Any], totals: dict[str, float], key: str) -> Callable[..., Any]:
    def wrapper(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return func(*args)
        finally:
            totals[key] += time.perf_counter() - start

    return wrapper


async def measure_overhead(
    num_requests: int = 256,
    num_steps: int = 200,
    *,
    prompt_len: int = 16,
    tokenizer: Any = None,
) -> OverheadResult:
    """Time ``num_steps`` steady steps of ``num_requests`` requests on a :class:`NullRunner`."""
    if num_requests < 1 or num_steps < 1:
        raise ValueError("num_requests and num_steps must be >= 1")
    runner = NullRunner(max_model_len=prompt_len + num_steps + 8)
    config = EngineConfig(
        model="null", scheduler="fcfs", max_num_seqs=num_requests,
        max_num_batched_tokens=max(4096, num_requests * prompt_len),
    )
    totals = {"schedule": 0.0, "update": 0.0, "fan_out": 0.0}
    params = SamplingParams(max_tokens=num_steps + 1, temperature=0.0, ignore_eos=True)
    async with AsyncEngine(config, runner=runner, tokenizer=tokenizer) as engine:
        core = engine.core
        assert core is not None
        core.schedule = _timed(core.schedule, totals, "schedule")  # type: ignore[method-assign]
        core.update = _timed(core.update, totals, "update")  # type: ignore[method-assign]
        step_loop = engine.step_loop
        assert step_loop is not None
        step_loop.fan_out = _timed(step_loop.fan_out, totals, "fan_out")  # type: ignore[method-assign]
        marks: list[float] = []

        async def consume(index: int) -> None:
            prompt = [1] + [3 + (index + i) % 400 for i in range(prompt_len - 1)]
            async for out in engine.generate(prompt, params):
                if index == 0 and out.num_output_tokens == 1:
                    marks.append(time.perf_counter())
                    for key in totals:
                        totals[key] = 0.0

        await asyncio.gather(*(consume(i) for i in range(num_requests)))
        end = time.perf_counter()
    per_step = 1e6 / num_steps
    step_us = (end - marks[0]) * per_step
    parts = {key: value * per_step for key, value in totals.items()}
    loop_us = sum(parts.values())
    return OverheadResult(
        num_requests, num_steps, step_us, parts["schedule"], parts["update"], parts["fan_out"],
        loop_us, step_us - loop_us,
    )
