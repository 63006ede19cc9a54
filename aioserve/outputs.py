"""What a request's stream yields: one delta per step."""

from __future__ import annotations

from dataclasses import dataclass

from aioserve.request import RequestMetrics


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Log-probability (natural log) of a sampled token and, optionally, the top tokens."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class RequestOutput:
    """A delta of one request's generation; read-only (not frozen: built once per
    request per step, and a frozen dataclass costs about 5x more to construct).

    Attributes:
        request_id: the request's id.
        text: new text since the previous output (may be empty while a UTF-8
            character or a possible stop string is held back).
        token_ids: new token ids since the previous output.
        finished: True on the last output of the request.
        finish_reason: ``"stop"``, ``"length"``, ``"abort"`` or ``"error"`` when finished.
        num_prompt_tokens: prompt length in tokens.
        num_output_tokens: output tokens so far, cumulative (counts a terminating EOS).
        logprobs: one entry per new token when the request asked for logprobs.
        metrics: the request's timestamps; complete when ``finished``.
        error: the error message when ``finish_reason == "error"``.
        num_cached_tokens: prompt tokens served from the prefix cache at admission
            (not computed for this request).
    """

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    logprobs: list[TokenLogprob] | None = None
    metrics: RequestMetrics | None = None
    error: str | None = None
    num_cached_tokens: int = 0

    @property
    def usage(self) -> dict[str, int | dict[str, int]]:
        """OpenAI-style usage counts (tokens), cached prompt tokens included."""
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": self.num_output_tokens,
            "total_tokens": self.num_prompt_tokens + self.num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": self.num_cached_tokens},
        }
