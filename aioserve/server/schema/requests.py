"""The request bodies (``/v1/completions``, ``/v1/chat/completions``, the websocket's
``generate``) read with pydantic: ``null`` is "not set", unknown fields are ignored, JSON
kinds are strict (an integral ``2.0`` is an integer), and an error names its field.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from aioserve.request_meta import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    MAX_TENANT_CHARS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RequestMeta,
)
from aioserve.sampling_params import FLOAT32_MAX, SamplingParams

#: Most prompts (or samples: ``n`` times the prompts) one call may start.
MAX_SEQUENCES_PER_CALL = 256
#: An ``X-Tenant`` header value: visible ASCII (the body's ``user`` takes any text).
TENANT_HEADER = re.compile(f"[!-~]{{1,{MAX_TENANT_CHARS}}}")
#: Seeds a sampler generator accepts (torch takes a 64-bit value, signed or not).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


class RequestFieldError(ValueError):
    """A missing or invalid field: ``param`` names it (or a header such as ``X-Tenant``);
    ``code`` is ``invalid_value`` or ``model_not_found`` (a 404)."""

    def __init__(self, param: str | None, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def refuse(message: str, param: str | None = None, code: str = "invalid_value") -> Exception:
    """A validator's error with its own message (``param``: default the field checked)."""
    return PydanticCustomError("aioserve", "{message}",
                               {"message": message, "param": param, "code": code})


def leading_word(message: str) -> str:
    """The identifier a message starts with (``"max_tokens: ..."`` -> ``max_tokens``)."""
    match = re.match(r"[A-Za-z_]+", message)
    return match.group(0) if match else ""


def _integral(value: Any) -> Any:
    return int(value) if type(value) is float and value.is_integer() else value


def _float_range(value: Any) -> Any:
    if type(value) is int:
        try:
            float(value)
        except OverflowError:
            raise refuse("too large for a number") from None
    return value


Integer = Annotated[int, Strict(), BeforeValidator(_integral)]
Number = Annotated[float, Strict(), AllowInfNan(False), BeforeValidator(_float_range)]
String = Annotated[str, Strict()]
Boolean = Annotated[bool, Strict()]
NonEmpty = Annotated[String, Field(min_length=1)]
#: A prompt's token id (``x-token-id``: the OpenAPI document bounds it by the vocabulary).
TokenId = Annotated[Integer, Field(ge=0, json_schema_extra={"x-token-id": True})]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
#: ``prompt`` as the JSON Schema describes it.
PromptSchema = (
    NonEmpty
    | Annotated[list[NonEmpty], Field(min_length=1, max_length=MAX_SEQUENCES_PER_CALL)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_SEQUENCES_PER_CALL)]
)


@dataclass(frozen=True)
class Served:
    """The validation context: the served ``model`` name (None: any) and its ``aliases``,
    the context length ``max_model_len`` (None: unchecked here)."""

    model: str | None = None
    max_model_len: int | None = None
    aliases: tuple[str, ...] = ()

    def accepts(self, name: str) -> bool:
        """Whether ``name`` names the served model."""
        return self.model is None or name == self.model or name in self.aliases


Body = TypeVar("Body", bound=BaseModel)
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict"}  # in pydantic's error paths


def parse(model: type[Body], body: dict[str, Any], served: Served | None = None) -> Body:
    """``body`` read as ``model``; RequestFieldError for its first fault."""
    try:
        return model.model_validate(body, context=served)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        ctx = error.get("ctx") or {}
        custom = error["type"] == "aioserve"
        field = (custom and ctx.get("param")) or (str(error["loc"][0]) if error["loc"] else None)
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]
                       if isinstance(p, int) or p.isidentifier() and p not in _UNION_TAGS)
        message = ctx["message"] if custom else error["msg"]
        if field is not None and leading_word(message) != field:
            message = f"{path.lstrip('.') or field}: {message}"
        code = ctx["code"] if custom else "invalid_value"
        raise RequestFieldError(field, message, code) from None


# The prompt and the chat messages: fields of several shapes, each read by one function.

def _id_list(value: Any) -> list[int] | None:
    """``value`` as token ids (integral floats taken as integers), else None."""
    if not isinstance(value, list):
        return None
    ids: list[int] = value
    if not all(type(x) is int for x in value):
        if not all(type(x) is int or (type(x) is float and x.is_integer()) for x in value):
            return None
        ids = [int(x) for x in value]
    if ids and min(ids) < 0:
        raise refuse(f"prompt token ids must be non-negative integers, got {min(ids)}")
    return ids


def check_prompt(value: Any) -> list[str] | list[list[int]]:
    """The ``prompt`` field as a list of prompts."""
    ids = _id_list(value) if value else None
    if isinstance(value, str):
        prompts: list[Any] = [value]
    elif ids is not None:
        prompts = [ids]
    elif isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        prompts = list(value)
    elif isinstance(value, list) and value and all(_id_list(p) is not None for p in value):
        prompts = [_id_list(p) for p in value]
    elif value is None:
        raise refuse("prompt is required")
    elif isinstance(value, list) and not value:
        raise refuse("prompt is empty")
    else:
        raise refuse("prompt must be a string, a list of strings, a list of token ids, "
                     "or a list of token-id lists")
    if any(len(p) == 0 for p in prompts):
        raise refuse("prompt is empty")
    return prompts


def check_one_prompt(value: Any) -> str | list[int]:
    """The ``prompt`` of a websocket message: text or token ids, not a list of prompts."""
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        raise refuse("prompt must be one string or one list of token ids on the websocket: "
                     "send one generate message per prompt")
    return check_prompt(value)[0]


class TextPart(BaseModel):
    """A text part of a message's content (the only kind of part supported)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    type: Literal["text"]
    text: String


class ChatMessage(BaseModel):
    """One chat message; its content is text, text parts, or null (empty)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: String | list[TextPart] | None = None

    def as_text(self) -> dict[str, str]:
        """The message as a chat template takes it: its content flattened to text."""
        content = self.content
        if not isinstance(content, str):
            content = "".join(part.text for part in content or ())
        return {"role": self.role, "content": content}


# The field groups the bodies share.

@dataclass(frozen=True)
class Needs:
    """A rule between fields: ``field`` (or its ``sub`` field) set needs ``needs`` true;
    checked by :class:`ApiBody` and stated in its JSON Schema."""

    field: str
    needs: str
    sub: str | None = None

    def broken(self, body: BaseModel) -> bool:
        value = getattr(body, self.field)
        if self.sub is not None and value is not None:
            value = getattr(value, self.sub)
        return value is not None and not getattr(body, self.needs)

    def json_schema(self) -> dict[str, Any]:
        present: dict[str, Any] = {"not": {"type": "null"}}
        if self.sub is not None:
            present = {"type": "object", "required": [self.sub],
                       "properties": {self.sub: present}}
        return {"if": {"required": [self.field], "properties": {self.field: present}},
                "then": {"required": [self.needs], "properties": {self.needs: {"const": True}}}}


def _rules_schema(schema: dict[str, Any], cls: type[ApiBody]) -> None:
    if cls.RULES:
        schema["allOf"] = [rule.json_schema() for rule in cls.RULES]


class ApiBody(BaseModel):
    """Every request body: unknown fields are ignored; ``model`` is checked first."""

    model_config = ConfigDict(extra="ignore", frozen=True, json_schema_extra=_rules_schema)
    RULES: ClassVar[tuple[Needs, ...]] = ()

    model: String | None = Field(None, description="must equal the served name (else 404)")

    @field_validator("model")
    @classmethod
    def _served(cls, model: str | None, info: ValidationInfo) -> str | None:
        served = info.context if isinstance(info.context, Served) else Served()
        if model is not None and not served.accepts(model):
            raise refuse(f"model {model!r} does not exist; this server serves "
                         f"{served.model!r}", code="model_not_found")
        return model

    @model_validator(mode="after")
    def _rules(self) -> ApiBody:
        for rule in self.RULES:
            if rule.broken(self):
                raise refuse(f"{rule.field} needs {rule.needs}: true", rule.field)
        return self


def _neutral(name: str, *values: Any) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None or any(type(value) is type(v) and value == v for v in values):
            return value
        raise refuse(f"{name} is not supported by this server")
    return check


class Unsupported(ApiBody):
    """OpenAI fields this server does not implement: only their neutral value (or null)
    is accepted; any other is a 400 naming the field, never silently ignored."""

    echo: Annotated[Any, PlainValidator(_neutral("echo", False),
                                        json_schema_input_type=Literal[False] | None)] = None
    suffix: Annotated[Any, PlainValidator(_neutral("suffix", ""),
                                          json_schema_input_type=Literal[""] | None)] = None
    logit_bias: Annotated[Any, PlainValidator(
        _neutral("logit_bias", {}),
        json_schema_input_type=Annotated[dict[str, float], Field(max_length=0)] | None)] = None
    presence_penalty: Annotated[Any, PlainValidator(
        _neutral("presence_penalty", 0, 0.0), json_schema_input_type=Literal[0] | None)] = None
    frequency_penalty: Annotated[Any, PlainValidator(
        _neutral("frequency_penalty", 0, 0.0), json_schema_input_type=Literal[0] | None)] = None
    tools: Annotated[Any, PlainValidator(
        _neutral("tools", []),
        json_schema_input_type=Annotated[list[Any], Field(max_length=0)] | None)] = None
    functions: Annotated[Any, PlainValidator(
        _neutral("functions", []),
        json_schema_input_type=Annotated[list[Any], Field(max_length=0)] | None)] = None


class SamplingFields(ApiBody):
    """The fields of :class:`~aioserve.sampling_params.SamplingParams`, same names."""

    max_tokens: Integer | None = Field(None, ge=1, description="most new tokens; prompt + "
                                       "max_tokens must fit the context")
    temperature: Number | None = Field(None, ge=0.0, le=FLOAT32_MAX, description="0 is greedy")
    top_p: Number | None = Field(None, gt=0.0, le=1.0)
    top_k: Integer | None = Field(None, ge=-1, description="0 or -1 disables")
    seed: Integer | None = Field(None, ge=SEED_MIN, le=SEED_MAX,
                                 description="sample i of n uses seed + i")
    stop: NonEmpty | list[NonEmpty] | None = None
    stop_token_ids: list[Annotated[Integer, Field(ge=0)]] | None = None
    ignore_eos: Boolean | None = None
    include_stop_str_in_output: Boolean | None = None
    repetition_penalty: Number | None = Field(None, gt=0.0, le=FLOAT32_MAX)
    length_hint: Integer | None = Field(None, ge=0, description="predicted output tokens, "
                                        "for length-aware scheduling policies; less than "
                                        "the context, as max_tokens")

    @field_validator("max_tokens", "max_completion_tokens", "length_hint", check_fields=False)
    @classmethod
    def _fits(cls, value: int | None, info: ValidationInfo) -> int | None:
        limit = info.context.max_model_len if isinstance(info.context, Served) else None
        if value is not None and limit is not None and value >= limit:
            raise refuse(f"{info.field_name} must be an integer <= {limit - 1} (the context "
                         f"is {limit} tokens), got {value}")
        return value

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        """The sampling parameters (unset fields: SamplingParams' defaults)."""
        kwargs = {name: getattr(self, name) for name in SamplingFields.model_fields
                  if name != "model" and getattr(self, name) is not None}
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        for name in ("stop", "stop_token_ids"):
            if isinstance(kwargs.get(name), list):
                kwargs[name] = tuple(kwargs[name])
        try:
            return SamplingParams(**kwargs)
        except ValueError as exc:
            raise RequestFieldError(leading_word(str(exc)), str(exc)) from None


class MetaFields(ApiBody):
    """The API's names for :class:`~aioserve.request_meta.RequestMeta`'s fields: its checks
    run once, when the body is read; its limits are only described here, for the schema."""

    priority: Integer | None = Field(None, json_schema_extra={
        "minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX},
        description="lower is served first (vLLM's extra field); default 0")
    user: String | None = Field(None, json_schema_extra={"maxLength": MAX_TENANT_CHARS},
                                description="who sends the request: the tenant scheduling "
                                "policies see (an X-Tenant header wins over it; empty: none)")
    ttft_slo_ms: Number | None = Field(None, json_schema_extra={"exclusiveMinimum": 0},
                                       description="time-to-first-token objective, ms")
    tpot_slo_ms: Number | None = Field(None, json_schema_extra={"exclusiveMinimum": 0},
                                       description="time-per-output-token objective, ms")
    deadline: Number | None = Field(None, json_schema_extra={"exclusiveMinimum": 0},
                                    description="when the request should have finished, "
                                    "Unix seconds")
    metadata: dict[String, String] | None = Field(None, json_schema_extra={
        "maxProperties": MAX_METADATA_PAIRS,
        "propertyNames": {"minLength": 1, "maxLength": MAX_METADATA_KEY_CHARS},
        "additionalProperties": {"maxLength": MAX_METADATA_VALUE_CHARS}},
        description="free string pairs passed to scheduling policies untouched")
    _meta: RequestMeta = PrivateAttr()

    @model_validator(mode="after")
    def _request_meta(self) -> MetaFields:
        try:
            self._meta = RequestMeta(
                priority=self.priority or 0, tenant=self.user or None,
                ttft_slo_ms=self.ttft_slo_ms, tpot_slo_ms=self.tpot_slo_ms,
                deadline=self.deadline, metadata=self.metadata or {})
        except ValueError as exc:  # its message starts with the field's name
            message = re.sub(r"^tenant\b", "user", str(exc))
            raise refuse(message, leading_word(message)) from None
        return self

    def request_meta(self, tenant_header: str | None) -> RequestMeta:
        """The request's :class:`RequestMeta`; ``tenant_header`` (``X-Tenant``, 1 to 256
        visible ASCII characters) wins over ``user``."""
        if not tenant_header:
            return self._meta
        if not TENANT_HEADER.fullmatch(tenant_header):
            raise RequestFieldError("X-Tenant", f"X-Tenant must be 1 to {MAX_TENANT_CHARS} "
                                    "visible ASCII characters (send others in user)")
        return replace(self._meta, tenant=tenant_header)


# The bodies.

class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a usage chunk before ``[DONE]``."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    include_usage: Boolean | None = None


class CallFields(Unsupported, MetaFields, SamplingFields):
    """The fields of both HTTP routes beyond the prompt."""

    RULES: ClassVar[tuple[Needs, ...]] = (Needs("stream_options", "stream", "include_usage"),)

    n: Integer | None = Field(
        None, ge=1, le=MAX_SEQUENCES_PER_CALL,
        description=f"samples per prompt (default 1); n times the number of prompts must "
        f"be at most {MAX_SEQUENCES_PER_CALL}, else 400 naming n")
    best_of: SkipJsonSchema[Any] = None  # only 1 or n: a rule JSON Schema cannot state
    stream: Boolean | None = None
    stream_options: StreamOptions | None = None
    request_id: String | None = Field(
        None, min_length=1, max_length=256,
        description="the call's id; must not be in use (else 400); also X-Request-Id")

    @model_validator(mode="after")
    def _best_of(self) -> CallFields:
        best_of = self.best_of
        if best_of is not None and not (type(best_of) is int and best_of in (1, self.n or 1)):
            raise refuse("best_of is not supported by this server", "best_of")
        return self

    @property
    def include_usage(self) -> bool:
        """With ``stream``: send a usage chunk before ``[DONE]``."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def call_id(self, header: str | None) -> str:
        """The ``request_id`` field, else the ``X-Request-Id`` header, else a new id."""
        request_id = self.request_id if self.request_id is not None else header
        if request_id is None:
            return uuid.uuid4().hex
        if not 0 < len(request_id) <= 256:
            raise RequestFieldError("request_id", "request_id must have 1 to 256 characters")
        return request_id


class CompletionRequest(CallFields):
    """``POST /v1/completions``."""

    prompt: Annotated[Any, PlainValidator(check_prompt, json_schema_input_type=PromptSchema),
                      Field(description=f"a string, a list of strings, token ids, or a list of "
                            f"token-id lists; n times the number of prompts must be at most "
                            f"{MAX_SEQUENCES_PER_CALL}")]
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

    RULES = (*CallFields.RULES, Needs("top_logprobs", "logprobs"))

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Integer | None = Field(
        None, ge=1, description="most new tokens; default: the rest of the context")
    logprobs: Boolean | None = None
    top_logprobs: Integer | None = Field(None, ge=0, le=20)

    @field_validator("messages", mode="before")
    @classmethod
    def _not_empty(cls, messages: Any) -> Any:
        if messages == []:
            raise refuse("messages is empty: the prompt would be empty")
        return messages

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
    prompt: Annotated[Any, PlainValidator(check_one_prompt, json_schema_input_type=Annotated[
        String, Field(min_length=1)] | TokenIds)]
    logprobs: Integer | None = Field(None, ge=0, le=20)
    stop_after: Integer | None = Field(None, ge=1, description="benchmarks only: stop after "
                                       "this many output tokens, unseen by the scheduler")

    @field_validator("n")
    @classmethod
    def _one(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise refuse("n must be 1 on the websocket: send one generate message (with its "
                         "own id) per sample")
        return n


_FIELDS = frozenset().union(*(m.model_fields for m in (
    CompletionRequest, ChatCompletionRequest, WsGenerate)))


def field_of_message(message: str, default: str | None = None) -> str | None:
    """The request field an engine error message starts with, else ``default``."""
    word = leading_word(message)
    return word if word in _FIELDS else default
