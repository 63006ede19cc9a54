"""RequestView: what a scheduling policy may read of a request, and nothing it can write."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from aioserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from aioserve.request import Request
    from aioserve.request_meta import RequestMeta


class RequestView:
    """A read-only window on one engine request: properties only, no setters, no new
    attributes (``__slots__``). The engine makes one per request when it is queued, so
    a policy pays no copy per step; read it during the call that handed it to you and
    keep only ids across steps.

    Token counts are in tokens; times are seconds on the engine's clock (the clock of
    ``SchedulerState.now``: ``time.monotonic()`` or the simulator's virtual clock).
    """

    __slots__ = ("_request",)

    def __init__(self, request: Request) -> None:
        self._request = request

    def __repr__(self) -> str:
        r = self._request
        return (f"RequestView({r.request_id!r}, status={r.status.value}, "
                f"prompt={r.num_prompt_tokens}, output={r.num_output_tokens})")

    # -- identity and sampling -------------------------------------------------------
    @property
    def request_id(self) -> str:
        return self._request.request_id

    @property
    def params(self) -> SamplingParams:
        """The sampling parameters (frozen): ``max_tokens``, ``length_hint``, ..."""
        return self._request.params

    @property
    def status(self) -> str:
        """``"waiting"``, ``"running"`` or ``"finished"``."""
        return self._request.status.value

    # -- who asks, how urgent (RequestMeta) -------------------------------------------
    @property
    def meta(self) -> RequestMeta:
        """All the request's metadata at once (frozen); the properties below read it."""
        return self._request.meta

    @property
    def priority(self) -> int:
        """Lower is served first (vLLM's convention); 0 when not given."""
        return self._request.meta.priority

    @property
    def tenant(self) -> str | None:
        """Who sent it (OpenAI ``user`` or ``X-Tenant``); None when not given."""
        return self._request.meta.tenant

    @property
    def ttft_slo_ms(self) -> float | None:
        """Time-to-first-token objective in milliseconds, or None."""
        return self._request.meta.ttft_slo_ms

    @property
    def tpot_slo_ms(self) -> float | None:
        """Time-per-output-token objective in milliseconds, or None."""
        return self._request.meta.tpot_slo_ms

    @property
    def deadline(self) -> float | None:
        """When the whole request should be done, on the engine's clock (seconds), or
        None."""
        return self._request.deadline

    @property
    def metadata(self) -> Mapping[str, str]:
        """The free string pairs the client sent (read-only)."""
        return self._request.meta.metadata

    # -- tokens --------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self._request.prompt_token_ids)

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        """The prompt's token ids (a copy: use the counts on hot paths)."""
        return tuple(self._request.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._request.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return self._request.num_tokens

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is computed or being computed by the step in flight."""
        return self._request.num_computed_tokens

    @property
    def num_output_placeholders(self) -> int:
        """Output tokens the step in flight will sample (ids not known yet)."""
        return self._request.num_output_placeholders

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served at its first admission."""
        return self._request.num_cached_tokens

    # -- KV blocks -----------------------------------------------------------------
    @property
    def block_ids(self) -> tuple[int, ...]:
        """The KV blocks it holds, in position order (a copy)."""
        return tuple(self._request.block_ids)

    @property
    def num_blocks(self) -> int:
        """KV blocks it holds."""
        return len(self._request.block_ids)

    # -- history (RequestMetrics) ----------------------------------------------------
    @property
    def arrival_time(self) -> float:
        return self._request.arrival_time

    @property
    def first_scheduled_time(self) -> float | None:
        """When it first started running, or None."""
        return self._request.metrics.first_scheduled_time

    @property
    def first_token_time(self) -> float | None:
        """When its first output token came back, or None."""
        return self._request.metrics.first_token_time

    @property
    def last_token_time(self) -> float | None:
        """When its latest output token came back, or None."""
        return self._request.metrics.last_token_time

    @property
    def num_preemptions(self) -> int:
        """Times it was preempted (its KV freed, recomputed on readmission)."""
        return self._request.metrics.num_preemptions
