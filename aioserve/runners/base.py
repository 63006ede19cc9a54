"""The runner boundary: a ``ScheduledBatch`` goes in, a ``RunnerOutput`` comes out.

Only plain data crosses it (lists of ints, frozen params), never tensors or live
engine objects, so a runner can live in a worker thread or another process. The
batch carries changes (new requests, new blocks, released ids, counts per request),
not the whole state: the runner keeps that between steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field

from aioserve.outputs import TokenLogprob
from aioserve.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class NewRequest:
    """A request that takes a slot in the runner (first admission, or readmission
    after a preemption: then it is recomputed from its tokens so far).

    Attributes:
        request_id: the request.
        token_ids: its known tokens, prompt then output (a recompute feeds them all).
        num_prompt_tokens: of ``token_ids``, the prompt.
        params: its sampling parameters.
        block_ids: its KV blocks, in position order (cached prefix blocks first).
        num_computed_tokens: leading tokens whose KV the blocks already hold (a prefix
            cache hit); the first step starts at this position.
    """

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One step's work, as changes to the runner's persistent state (vLLM V1's
    ``SchedulerOutput``): the runner keeps each request's tokens, positions, block
    table and sampling state between steps, so a decoding request costs one id and
    one count here. The lists ``request_ids`` .. ``num_output_tokens`` are aligned,
    one entry per scheduled request, in batch order.

    A step's input tokens are the request's known tokens (prompt, chunks, recompute)
    or, for the one position after them, the token the previous step sampled: that
    token may still be on the device when this step is scheduled (overlapped
    scheduling), and the runner feeds it from there.

    Attributes:
        request_ids: the scheduled requests.
        num_scheduled_tokens: tokens each feeds this step, from position
            ``start_positions[i]`` on.
        start_positions: each request's first new position (its tokens before it are
            in the KV cache, or being written by the step in flight).
        sample: whether a token is sampled after the request's last new token (False
            for a prefill chunk that does not reach the end of the known tokens).
        num_output_tokens: output index of the token sampled this step (the request's
            output tokens before it, including one still in flight).
        new_requests: requests that take a slot this step (state to create).
        new_block_ids: request id -> blocks appended to its block table this step.
        released_ids: requests finished or preempted since the last step: their state
            goes (a preempted one comes back later as a :class:`NewRequest`).
    """

    request_ids: list[str]
    num_scheduled_tokens: list[int]
    start_positions: list[int]
    sample: list[bool]
    num_output_tokens: list[int]
    new_requests: list[NewRequest] = field(default_factory=list)
    new_block_ids: dict[str, list[int]] = field(default_factory=dict)
    released_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens fed to the model this step (prefill + decode)."""
        return sum(self.num_scheduled_tokens)


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


@dataclass(frozen=True, slots=True)
class RunnerInfo:
    """What the operator log, the step log and ``/metrics`` report about a runner.

    Attributes:
        device: where the forward runs (``"cpu"``, ``"cuda:0"``); None: no device.
        dtype: the weights' and KV cache's dtype (``"float32"``); None: no tensors.
        forward: which forward runs and why; None: the configuration's ``forward``.
        kv_block_bytes: device bytes one KV block takes; None: no KV tensors.
        threads: intra-op CPU threads the forward runs on now; None: unknown.
        thread_choices: the counts a thread governor switches between (the last is the
            usable CPUs); empty when the count is fixed.
        load_times: seconds of each load phase, in the order they ran.
    """

    device: str | None = None
    dtype: str | None = None
    forward: str | None = None
    kv_block_bytes: int | None = None
    threads: int | None = None
    thread_choices: tuple[int, ...] = ()
    load_times: Mapping[str, float] = field(default_factory=dict)


class ModelRunner:
    """What the engine and the server use of a runner: every runner subclasses this. The
    attributes are set by the runner; the methods have defaults a runner may keep.

    Attributes:
        num_kv_blocks: KV-cache blocks the runner holds tensors for.
        block_size: tokens per block.
        max_model_len: context length in tokens.
        eos_token_ids: the model's end-of-sequence ids (from its generation config).
        vocab_size: token ids accepted in prompts are below this.
        overlaps: True when :meth:`submit` starts a step and returns at once, so the engine
            schedules step N+1 while N runs (vLLM's async scheduling); default False.
    """

    num_kv_blocks: int
    block_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    overlaps: bool = False

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        """Apply the batch's changes, run one forward pass over it and sample. Steps
        run in the order they are called. May raise; the engine then ends the batch's
        requests with an error and keeps serving."""
        raise NotImplementedError

    def submit(self, batch: ScheduledBatch) -> Awaitable[RunnerOutput]:
        """Start the step on ``batch``; the awaitable gives its output. Default: a task
        running :meth:`step`."""
        return asyncio.ensure_future(self.step(batch))

    def clock(self) -> float:
        """Seconds on the engine's clock: monotonic by default, the simulator's virtual one."""
        return time.monotonic()

    @property
    def idle_poll_s(self) -> float | None:
        """While idle, look at the runner again after this many seconds (to call
        :meth:`on_idle`); None (default): only when work arrives."""
        return None

    def on_idle(self) -> bool:
        """The engine is idle; True when the runner's arithmetic changed (then the
        prefix cache, computed by the old arithmetic, is emptied). Default: False."""
        return False

    def describe(self) -> RunnerInfo:
        """What the runner reports about itself; default: nothing known."""
        return RunnerInfo()

    def close(self) -> None:
        """Release threads and memory; default: nothing to release."""
