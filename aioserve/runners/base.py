"""The runner boundary: a ``ScheduledBatch`` goes in, a ``RunnerOutput`` comes out.

Only plain data crosses it (lists of ints, frozen params), never tensors or live
engine objects, so a runner can live in a worker thread or another process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from aioserve.outputs import TokenLogprob
from aioserve.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One step's work, one entry per scheduled request (all lists aligned).

    Attributes:
        request_ids: the requests.
        token_ids: the new tokens each request feeds this step (a prefill chunk,
            a recompute, or the one last sampled token while decoding).
        start_positions: position of each request's first new token (= its
            ``num_computed_tokens``).
        block_tables: each request's KV blocks, in position order.
        sample: whether a token is sampled after the request's last new token (False
            for a prefill chunk that does not reach the end of the prompt).
        sampling_params: each request's parameters.
        penalty_token_ids: prompt + output token ids for requests with a repetition
            penalty, else None.
        num_output_tokens: tokens each request had generated before this step.
        released_ids: finished requests whose per-request runner state can go.
    """

    request_ids: list[str]
    token_ids: list[list[int]]
    start_positions: list[int]
    block_tables: list[list[int]]
    sample: list[bool]
    sampling_params: list[SamplingParams]
    penalty_token_ids: list[list[int] | None]
    num_output_tokens: list[int]
    released_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens fed to the model this step (prefill + decode)."""
        return sum(len(t) for t in self.token_ids)


@dataclass(frozen=True, slots=True)
class RunnerOutput:
    """One step's result, aligned with the batch.

    Attributes:
        token_ids: the sampled token per request; -1 where ``sample`` was False.
        logprobs: per request, the sampled token's log-probability (and top ones)
            when its params asked for logprobs, else None.
    """

    token_ids: list[int]
    logprobs: list[TokenLogprob | None] | None = None


class ModelRunner(Protocol):
    """What the engine needs of a runner.

    Attributes:
        num_kv_blocks: KV-cache blocks the runner holds tensors for.
        block_size: tokens per block.
        max_model_len: context length in tokens.
        eos_token_ids: the model's end-of-sequence ids (from its generation config).
        vocab_size: token ids accepted in prompts are below this.
    """

    num_kv_blocks: int
    block_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    vocab_size: int

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        """Run one forward pass over the batch and sample. May raise; the engine
        then ends the batch's requests with an error and keeps serving."""
        ...

    def close(self) -> None:
        """Release threads and memory."""
        ...
