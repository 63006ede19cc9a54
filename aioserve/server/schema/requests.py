"""The request bodies: ``POST /v1/completions``, ``POST /v1/chat/completions`` and the
websocket's ``generate`` message. Rules between fields are checked after the fields and
stated in the JSON Schema as ``if``/``then`` clauses beside their check."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from aioserve.server.schema.field_errors import RequestFieldError, refuse
from aioserve.server.schema.fields import MetaFields, SamplingFields, Unsupported
from aioserve.server.schema.kinds import Boolean, Integer, String
from aioserve.server.schema.prompts import (
    MAX_SEQUENCES_PER_CALL,
    MessagesSchema,
    OnePromptSchema,
    PromptSchema,
    check_messages,
    check_one_prompt,
    check_prompt,
)


@dataclass(frozen=True)
class CallOptions:
    """The fields of an OpenAI call that are not sampling parameters.

    Attributes:
        n: samples per prompt (>= 1).
        stream: answer with Server-Sent Events.
        include_usage: with ``stream``, send a usage chunk before ``[DONE]``.
        request_id: the caller's id for the call (``request_id`` field or the
            ``X-Request-Id`` header), else one made for it (32 hex digits); the
            response's ``X-Request-Id`` header.
    """

    n: int
    stream: bool
    include_usage: bool
    request_id: str


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a usage chunk before ``[DONE]``."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    include_usage: Boolean | None = None


#: The rule "stream_options.include_usage needs stream: true", as JSON Schema.
_USAGE_NEEDS_STREAM: dict[str, Any] = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {
        "type": "object", "required": ["include_usage"],
        "properties": {"include_usage": {"type": "boolean"}}}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}


class CallFields(Unsupported, MetaFields, SamplingFields):
    """The fields of both HTTP routes beyond the prompt."""

    n: Integer | None = Field(None, ge=1, le=MAX_SEQUENCES_PER_CALL)
    best_of: SkipJsonSchema[Any] = None  # only 1 or n: a rule JSON Schema cannot state
    stream: Boolean | None = None
    stream_options: StreamOptions | None = None
    request_id: String | None = Field(
        None, min_length=1, max_length=256,
        description="the call's id; must not be in use (else 400); also X-Request-Id")

    @model_validator(mode="after")
    def _call_rules(self) -> CallFields:
        best_of = self.best_of
        if best_of is not None and not (type(best_of) is int and best_of in (1, self.n or 1)):
            raise refuse("best_of is not supported by this server", "best_of")
        usage = self.stream_options.include_usage if self.stream_options else None
        if usage is not None and not self.stream:
            raise refuse("stream_options needs stream: true", "stream_options")
        return self

    def call_options(self, header_request_id: str | None) -> CallOptions:
        """``n``, ``stream``, ``include_usage`` and the request id (the field, else the
        ``X-Request-Id`` header, else a new one).

        Raises:
            RequestFieldError: the header's id is not 1 to 256 characters.
        """
        request_id = self.request_id if self.request_id is not None else header_request_id
        if request_id is not None and not 0 < len(request_id) <= 256:
            raise RequestFieldError("request_id", "request_id must have 1 to 256 characters")
        usage = self.stream_options.include_usage if self.stream_options else None
        return CallOptions(n=self.n or 1, stream=bool(self.stream), include_usage=bool(usage),
                           request_id=request_id if request_id is not None else uuid.uuid4().hex)


class CompletionRequest(CallFields):
    """``POST /v1/completions``."""

    model_config = ConfigDict(json_schema_extra={"allOf": [_USAGE_NEEDS_STREAM]})

    prompt: Annotated[Any, PlainValidator(check_prompt, json_schema_input_type=PromptSchema)]
    max_tokens: Integer | None = Field(None, ge=1, json_schema_extra={"default": 16},
                                       description="prompt + max_tokens must fit the context")
    logprobs: Integer | None = Field(None, ge=0, le=20, description="top log-probabilities "
                                     "per token")

    @model_validator(mode="after")
    def _count(self) -> CompletionRequest:
        if len(self.prompt) * (self.n or 1) > MAX_SEQUENCES_PER_CALL:
            raise refuse(f"n times the number of prompts must be at most "
                         f"{MAX_SEQUENCES_PER_CALL}", "n")
        return self


class ChatCompletionRequest(CallFields):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` (or ``max_tokens``)
    defaults to the rest of the context."""

    model_config = ConfigDict(json_schema_extra={"allOf": [_USAGE_NEEDS_STREAM, {
        "if": {"required": ["top_logprobs"],
               "properties": {"top_logprobs": {"type": "integer"}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
    }]})

    messages: Annotated[Any, PlainValidator(check_messages,
                                            json_schema_input_type=MessagesSchema)]
    max_completion_tokens: Integer | None = Field(
        None, ge=1, description="most new tokens; default: the rest of the context")
    logprobs: Boolean | None = None
    top_logprobs: Integer | None = Field(None, ge=0, le=20)

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise refuse("top_logprobs needs logprobs: true", "top_logprobs")
        return self

    @property
    def limit_field(self) -> str:
        """The field that bounds the output: ``max_completion_tokens`` when set."""
        return "max_completion_tokens" if self.max_completion_tokens is not None \
            else "max_tokens"

    @property
    def logprobs_option(self) -> int | None:
        """``logprobs`` and ``top_logprobs`` as SamplingParams.logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None


class WsGenerate(Unsupported, MetaFields, SamplingFields):
    """A websocket ``generate`` message: one prompt, one stream (``n`` is 1), its own
    ``id`` on the socket; the other fields as in ``/v1/completions``."""

    type: Literal["generate"]
    id: String = Field(min_length=1, max_length=256)
    n: Integer | None = None
    prompt: Annotated[Any, PlainValidator(check_one_prompt,
                                          json_schema_input_type=OnePromptSchema)]
    logprobs: Integer | None = Field(None, ge=0, le=20)

    @field_validator("n")
    @classmethod
    def _one(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise refuse("n must be 1 on the websocket: send one generate message (with its "
                         "own id) per sample")
        return n
