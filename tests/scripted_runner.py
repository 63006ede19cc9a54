"""ScriptedRunner: a runner that emits a fixed token sequence, for exact tests of
stopping, detokenization and the server protocol without a model."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from aioserve.runners.base import ModelRunner, RunnerOutput, ScheduledBatch


class ScriptedRunner(ModelRunner):
    """Each request's n-th sampled token is ``script(request_id)[n]``; past the end of
    the script it repeats the last token.

    Args:
        script: token ids for every request, or a function from request id to them.
        vocab_size: token ids accepted in prompts.
        max_model_len: context length in tokens.
        num_kv_blocks, block_size: the KV cache the engine manages (no tensors here).
        eos_token_ids: the "model's" EOS ids.
        fail_on_step: raise RuntimeError in this step (0-based), to test error paths.
    """

    def __init__(
        self,
        script: Sequence[int] | Callable[[str], Sequence[int]],
        *,
        vocab_size: int = 512,
        max_model_len: int = 512,
        num_kv_blocks: int = 256,
        block_size: int = 16,
        eos_token_ids: tuple[int, ...] = (2,),
        fail_on_step: int | None = None,
    ) -> None:
        self._script = script if callable(script) else (lambda _id, s=tuple(script): s)
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.eos_token_ids = eos_token_ids
        self.fail_on_step = fail_on_step
        self.steps = 0
        self.prefilled_ids: list[str] = []
        self._seen: set[str] = set()

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        """Return each request's next scripted token (yields to the loop once)."""
        await asyncio.sleep(0)
        step, self.steps = self.steps, self.steps + 1
        if step == self.fail_on_step:
            raise RuntimeError(f"injected failure in step {step}")
        self._seen.difference_update(batch.released_ids)
        tokens = []
        for request_id, start, sample, produced in zip(
            batch.request_ids, batch.start_positions, batch.sample, batch.num_output_tokens
        ):
            # a request's first chunk (after any cached prefix), or a recompute
            if start == 0 or request_id not in self._seen:
                self.prefilled_ids.append(request_id)
                self._seen.add(request_id)
            script = self._script(request_id)
            tokens.append(script[min(produced, len(script) - 1)] if sample else -1)
        return RunnerOutput(token_ids=tokens)


class GatedRunner(ScriptedRunner):
    """A ScriptedRunner whose steps wait for ``gate``, on a clock the test sets (``now``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        await self.gate.wait()
        return await super().step(batch)
