"""What the serving benchmark records of each request: its timings and token count, and
the error a refused API key gets.

Times are seconds on ``time.perf_counter``; metrics follow ``vllm bench serve``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class AuthenticationError(Exception):
    """The server answered 401: the API key is missing or wrong."""


def refused(base_url: str, api_key: str | None, detail: str) -> AuthenticationError:
    """The error for a 401 from ``base_url``, saying whether a key was sent."""
    advice = ("the API key was refused" if api_key
              else "the server needs an API key (--api-key, $OPENAI_API_KEY or "
                   "$AIOSERVE_API_KEY)")
    return AuthenticationError(f"{base_url}: 401 Unauthorized: {advice}: {detail}")


@dataclass
class RequestRecord:
    """One request's timings (seconds, ``time.perf_counter``).

    Attributes:
        prompt_len: prompt tokens.
        output_len: requested output tokens.
        start: when the request was sent.
        chunk_times: arrival time of every chunk that carried tokens; over SSE, of every
            network read that carried tokens (events read together count once, as
            ``vllm bench serve`` counts a chunk once, so they make no 0-ms gap).
        output_tokens: tokens received (the server's usage count when it sends one).
        end: when the response ended.
        error: why it failed, or None.
        cached_tokens: prompt tokens the server took from its prefix cache (its usage's
            ``prompt_tokens_details.cached_tokens``; 0 when it sends none).
        group: the request's (tenant, priority), for the per-group figures.
        slo_ms: its own (TTFT, TPOT) objectives in ms, for goodput (None: the run's).
    """

    prompt_len: int
    output_len: int
    start: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    end: float = 0.0
    error: str | None = None
    cached_tokens: int = 0
    group: tuple[str | None, int] = (None, 0)
    slo_ms: tuple[float | None, float | None] = (None, None)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.start

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first (None for one token)."""
        if self.output_tokens < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        """Seconds between consecutive chunks that carried tokens."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]
