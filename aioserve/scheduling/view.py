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
    attributes (``__slots__``). The engine makes one per request when it is queued, so a
    policy pays no copy per step; read it during the call that handed it to you and keep
    only ids across steps.

    Counts are in tokens (blocks for ``num_blocks``); times are seconds on the engine's
    clock (``SchedulerState.now``'s: ``time.monotonic()`` or the simulator's). ``priority``,
    ``tenant``, ``ttft_slo_ms``, ``tpot_slo_ms`` and ``metadata`` are ``meta``'s fields
    (:class:`~aioserve.request_meta.RequestMeta`); ``deadline`` is its deadline (when it
    should be finished, its last token out) on the engine's clock. The history
    (``first_scheduled_time``, ``first_token_time``, ``last_token_time``) is None until
    it happens. Nothing here tells a request's true length: a hidden stop (benchmarks)
    stays in the engine core."""

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

    @property
    def finish_reason(self) -> str | None:
        """Once finished: ``"stop"``, ``"length"``, ``"abort"`` or ``"error"`` (shed)."""
        reason = self._request.finish_reason
        return reason.value if reason is not None else None

    # -- who asks, how urgent (RequestMeta) -------------------------------------------
    @property
    def meta(self) -> RequestMeta:
        return self._request.meta

    @property
    def priority(self) -> int:
        return self._request.meta.priority

    @property
    def tenant(self) -> str | None:
        return self._request.meta.tenant

    @property
    def ttft_slo_ms(self) -> float | None:
        return self._request.meta.ttft_slo_ms

    @property
    def tpot_slo_ms(self) -> float | None:
        return self._request.meta.tpot_slo_ms

    @property
    def deadline(self) -> float | None:
        return self._request.deadline

    @property
    def metadata(self) -> Mapping[str, str]:
        return self._request.meta.metadata

    # -- tokens --------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self._request.prompt_token_ids)

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        """A copy: use the counts on hot paths."""
        return tuple(self._request.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._request.output_token_ids)

    @property
    def num_tokens(self) -> int:
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
        """A copy, in position order."""
        return tuple(self._request.block_ids)

    @property
    def num_blocks(self) -> int:
        return len(self._request.block_ids)

    # -- history (RequestMetrics) ----------------------------------------------------
    @property
    def arrival_time(self) -> float:
        return self._request.arrival_time

    @property
    def first_scheduled_time(self) -> float | None:
        return self._request.metrics.first_scheduled_time

    @property
    def first_token_time(self) -> float | None:
        return self._request.metrics.first_token_time

    @property
    def last_token_time(self) -> float | None:
        return self._request.metrics.last_token_time

    @property
    def num_preemptions(self) -> int:
        """Times its KV was freed, to be recomputed on readmission."""
        return self._request.metrics.num_preemptions
