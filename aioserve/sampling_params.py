"""Per-request sampling parameters (the names follow vLLM and the OpenAI API)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Temperatures at or below this are treated as greedy (vLLM's ``_SAMPLING_EPS``).
GREEDY_TEMPERATURE = 1e-5
#: The largest finite float32: the sampler keeps temperatures and penalties in float32
#: tensors, where a larger value would fail the model step of a whole batch.
FLOAT32_MAX = 3.4028234663852886e38


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _float32(value: object) -> bool:
    """A number a float32 holds without overflow (finite, |value| <= FLOAT32_MAX)."""
    return _is_number(value) and -FLOAT32_MAX <= value <= FLOAT32_MAX  # type: ignore[operator]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each new token and when to stop.

    Attributes:
        max_tokens: most new tokens to generate (>= 1).
        temperature: 0 (or <= 1e-5) is greedy; otherwise logits are divided by it.
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 or -1 disables it.
        seed: per-request seed; the same seed gives the same tokens in any batch.
        stop: strings that end generation; they are not part of the returned text
            unless ``include_stop_str_in_output``.
        stop_token_ids: token ids that end generation (in addition to the model's EOS).
        ignore_eos: keep generating past the model's EOS ids (``stop_token_ids`` still stop).
        include_stop_str_in_output: keep a matched stop string in the text.
        repetition_penalty: > 0; 1 disables it. Logits of tokens already in the prompt
            or output are divided by it when positive and multiplied when negative
            (Keskar et al. 2019, CTRL; as transformers and vLLM apply it).
        logprobs: number of top log-probabilities to return per token (None: none).
        length_hint: predicted number of output tokens, for length-aware schedulers.

    Raises:
        ValueError: a field is out of range; the message names the field.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = field(default=())
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    length_hint: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self._validate()

    def _validate(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _float32(self.temperature):
            raise ValueError(f"temperature must be a finite number <= {FLOAT32_MAX} "
                             f"(float32), got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(
                f"top_k must be an integer >= -1 (0 or -1 disables), got {self.top_k!r}"
            )
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError(f"seed must fit in 64 bits, got {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be a list of non-negative integers")
        rp = self.repetition_penalty
        if not _float32(rp) or rp <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 and <= "
                             f"{FLOAT32_MAX} (float32), got {rp!r}")
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= 20
        ):
            raise ValueError(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        if self.length_hint is not None and (not _is_int(self.length_hint) or self.length_hint < 0):
            raise ValueError(f"length_hint must be an integer >= 0, got {self.length_hint!r}")

    @property
    def greedy(self) -> bool:
        """True when the token is picked by argmax."""
        return self.temperature <= GREEDY_TEMPERATURE
