"""A request inside the engine: tokens, one progress counter, its KV blocks."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from aioserve.block_keys import BlockKey
from aioserve.errors import AdmissionError
from aioserve.request_meta import DEFAULT_META, RequestMeta
from aioserve.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    """Where a request is: waiting for a slot, running, or finished."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    """Why a request ended (the OpenAI API's words, plus ``abort`` and ``error``)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass
class RequestMetrics:
    """Timestamps (seconds, ``time.monotonic()`` or a virtual clock) and step numbers."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    first_scheduled_step: int | None = None
    finished_step: int | None = None
    num_preemptions: int = 0


@dataclass(eq=False, slots=True)
class Request:
    """One generation request.

    Progress is a single counter, as in vLLM V1: ``num_computed_tokens`` catches up with
    ``num_tokens`` (prompt + output); behind by more than one token it is prefilling (or
    recomputing after a preemption), by one decoding. It advances when a step is
    scheduled: ``num_in_flight_tokens`` of it belong to steps not finished yet, whose
    sampled tokens are placeholders (``num_output_placeholders``) until their ids come
    back. ``epoch`` counts preemptions, so a step scheduled before one is dropped.
    ``deadline`` is ``meta.deadline`` on the engine's clock.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    block_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens the prefix cache held at first admission
    block_keys: list[BlockKey] = field(default_factory=list)
    num_registered_blocks: int = 0  # leading blocks offered to the prefix cache
    num_in_flight_tokens: int = 0
    num_output_placeholders: int = 0
    epoch: int = 0
    meta: RequestMeta = DEFAULT_META
    deadline: float | None = None
    shed_reason: str | None = None  # why a policy shed it (it ends with ``error``)
    refusal: AdmissionError | None = None  # the admission limit ended it (``error``)
    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    @property
    def num_confirmed_tokens(self) -> int:
        """Tokens whose KV is computed (excluding steps still in flight)."""
        return self.num_computed_tokens - self.num_in_flight_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def token_ids_from(self, start: int, count: int) -> list[int]:
        """``count`` token ids of prompt + output starting at position ``start``."""
        n_prompt = len(self.prompt_token_ids)
        if count == 1 and start >= n_prompt:  # decoding: one output token, no copy of the rest
            return [self.output_token_ids[start - n_prompt]]
        if start + count <= n_prompt:
            return self.prompt_token_ids[start : start + count]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : start - n_prompt + count]
        return (self.prompt_token_ids + self.output_token_ids)[start : start + count]
