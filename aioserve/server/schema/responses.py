"""The response bodies, as ``/openapi.json`` describes them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: Why a choice ended (``abort``: cancelled or the client left; ``error``: its
#: delivery failed).
FinishReason = Literal["stop", "length", "abort", "error"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CachedTokens(_Out):
    """Prompt tokens served from the prefix cache."""

    cached_tokens: int = Field(ge=0)


class Usage(_Out):
    """Token counts of a call (each prompt counted once, not once per sample)."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    prompt_tokens_details: CachedTokens


class CompletionLogprobs(_Out):
    """Per-token log-probabilities of a completion choice."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Out):
    """A completion choice (in a chunk: the text since the last chunk)."""

    index: int = Field(ge=0)
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class _Head(_Out):
    id: str
    created: int
    model: str


class Completion(_Head):
    """The response of ``POST /v1/completions``."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(_Head):
    """One Server-Sent Event of a completion stream (``usage`` only in the last, with
    ``include_usage``)."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(_Out):
    """A candidate token of a chat logprobs entry."""

    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    """A chat logprobs entry: the chosen token and its candidates."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    """The ``logprobs`` of a chat choice."""

    content: list[TokenLogprob]


class AssistantMessage(_Out):
    """The generated message."""

    role: Literal["assistant"]
    content: str


class ChatChoice(_Out):
    """A chat completion choice."""

    index: int = Field(ge=0)
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletion(_Head):
    """The response of ``POST /v1/chat/completions``."""

    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage


class Delta(_Out):
    """What a chat chunk adds: the role (first chunk), then content."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Out):
    """A chat stream chunk's choice."""

    index: int = Field(ge=0)
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(_Head):
    """One Server-Sent Event of a chat stream."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ErrorDetail(_Out):
    """What went wrong; ``param`` names the request field at fault."""

    message: str
    type: str
    param: str | None
    code: str | None


class Error(_Out):
    """Every error the HTTP API answers (also a stream's last event when it fails)."""

    error: ErrorDetail


class Model(_Out):
    """The served model."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    max_model_len: int | None


class ModelList(_Out):
    """``GET /v1/models``."""

    object: Literal["list"]
    data: list[Model]


class Health(BaseModel):
    """``GET /health``: ``ok``, ``shutting down`` or ``engine not running``."""

    status: str
