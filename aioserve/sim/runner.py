"""SimulatedRunner: the runner interface on a virtual clock, for comparing schedulers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from aioserve.runners.base import ModelRunner, RunnerOutput, ScheduledBatch
from aioserve.sim.step_cost import StepCostModel
from aioserve.workloads.request import FIRST_WORD_ID, NS_PER_S

#: Nanoseconds per millisecond; the clock counts integer nanoseconds so that sums of steps
#: stay exact (100 steps of 50 ms end at exactly 5.0 s).
NS_PER_MS = 1_000_000


class SimulatedRunner(ModelRunner):
    """A runner with a virtual clock and scripted output lengths.

    A request's n-th token is EOS once ``n + 1`` reaches its scripted length (requests
    without a script never emit EOS); tokens depend only on the request and the index, so
    a recomputed request produces exactly what it would have. Costs are in milliseconds
    (``step_ms`` per step, ``prefill_ms_per_token`` per prompt or recomputed token, or a
    ``cost_model``); ``on_clock`` is called with the clock (ns) when a step ends."""

    def __init__(
        self,
        output_lengths: Mapping[str, int] | Callable[[str], int | None] | None = None,
        *,
        step_ms: float = 50.0,
        prefill_ms_per_token: float = 0.0,
        num_kv_blocks: int = 1024,
        block_size: int = 16,
        max_model_len: int = 4096,
        vocab_size: int = 512,
        eos_token_id: int = 2,
        cost_model: StepCostModel | None = None,
    ) -> None:
        if step_ms < 0 or prefill_ms_per_token < 0:
            raise ValueError("step_ms and prefill_ms_per_token must be >= 0")
        if min(num_kv_blocks, block_size, max_model_len) <= 0 or vocab_size <= FIRST_WORD_ID:
            raise ValueError("num_kv_blocks, block_size, max_model_len and vocab_size too small")
        if output_lengths is None:
            self._length: Callable[[str], int | None] = lambda _id: None
        elif callable(output_lengths):
            self._length = output_lengths
        else:
            self._length = output_lengths.get
        self.step_ns = round(step_ms * NS_PER_MS)
        self.prefill_ns_per_token = round(prefill_ms_per_token * NS_PER_MS)
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids: tuple[int, ...] = (eos_token_id,)
        self.cost_model = cost_model
        self.now_ns = 0
        self.steps = 0
        self.prefill_tokens = 0
        self.on_clock: Callable[[int], None] | None = None

    def clock(self) -> float:
        """The virtual time in seconds."""
        return self.now_ns / NS_PER_S

    def advance_to(self, time_ns: int) -> None:
        """Move the clock forward to ``time_ns`` (never backwards)."""
        self.now_ns = max(self.now_ns, time_ns)

    def token_for(self, request_id: str, index: int) -> int:
        length = self._length(request_id)
        if length is not None and index + 1 >= length:
            return self.eos_token_ids[0]
        return FIRST_WORD_ID + index % (self.vocab_size - FIRST_WORD_ID)

    def step_cost_ns(self, batch: ScheduledBatch) -> int:
        """Step cost in ns: the calibrated model's, else ``step_ms`` plus its prefill tokens'."""
        prefill = sum(
            count
            for count, produced in zip(batch.num_scheduled_tokens, batch.num_output_tokens)
            if not (count == 1 and produced > 0)
        )
        self.prefill_tokens += prefill
        if self.cost_model is not None:
            return max(round(self.cost_model.batch_cost_ms(batch) * NS_PER_MS), 1)
        return self.step_ns + prefill * self.prefill_ns_per_token

    def outputs(self, batch: ScheduledBatch) -> RunnerOutput:
        token_for = self.token_for
        tokens = [token_for(request_id, produced) if sample else -1
                  for request_id, produced, sample in zip(
                      batch.request_ids, batch.num_output_tokens, batch.sample)]
        return RunnerOutput(token_ids=tokens)

    def _end_step(self, end_ns: int) -> None:
        self.now_ns = max(self.now_ns, end_ns)
        self.steps += 1
        if self.on_clock is not None:
            self.on_clock(self.now_ns)

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        """Advance the clock by the step's cost and return each request's next token."""
        self._end_step(self.now_ns + self.step_cost_ns(batch))
        await asyncio.sleep(0)
        return self.outputs(batch)


class OverlappedRunner(SimulatedRunner):
    """A simulated runner the engine schedules one step ahead of, as the TorchRunner: a
    submitted step starts when the one before it ends."""

    overlaps = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.busy_until_ns = 0

    def submit(self, batch: ScheduledBatch) -> Coroutine[Any, Any, RunnerOutput]:
        start = max(self.now_ns, self.busy_until_ns)
        self.busy_until_ns = end = start + self.step_cost_ns(batch)
        return self._finish(batch, end)

    async def _finish(self, batch: ScheduledBatch, end_ns: int) -> RunnerOutput:
        self._end_step(end_ns)
        await asyncio.sleep(0)
        return self.outputs(batch)
