"""The field groups the request bodies share: sampling, scheduling metadata, the
OpenAI fields this server refuses, and the served model.

A field sent as ``null`` is "not set" (its default); unknown fields are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationInfo, field_validator

from aioserve.request_meta import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    MAX_TENANT_CHARS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RequestMeta,
)
from aioserve.sampling_params import SamplingParams
from aioserve.server.schema.field_errors import RequestFieldError, leading_word, refuse
from aioserve.server.schema.kinds import FLOAT32_MAX, Boolean, Integer, NonNegative, Number, String

#: An ``X-Tenant`` header value: visible ASCII (the body's ``user`` takes any text).
TENANT_HEADER = re.compile(f"[!-~]{{1,{MAX_TENANT_CHARS}}}")
#: Seeds a sampler generator accepts (torch takes a 64-bit value, signed or not).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass(frozen=True)
class Served:
    """What validation knows of the server (the validation context).

    Attributes:
        model: the served model name (the only ``model`` accepted), or None: any.
        max_model_len: the context length in tokens, or None: unchecked here.
        aliases: other names ``model`` may take (the ``--model`` path as given, a local
            directory's own name); none with ``--served-model-name``.
    """

    model: str | None = None
    max_model_len: int | None = None
    aliases: tuple[str, ...] = ()

    def accepts(self, name: str) -> bool:
        """Whether ``name`` names the served model (any name when ``model`` is None)."""
        return self.model is None or name == self.model or name in self.aliases


def _stop(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value):
        return value
    if isinstance(value, list) and all(isinstance(s, str) and s for s in value):
        return value
    raise refuse("stop must be a string or a list of non-empty strings")


NonEmpty = Annotated[String, Field(min_length=1)]
#: ``stop``: one string or a list (read by :func:`_stop`, described by its input type).
Stop = Annotated[Any, PlainValidator(_stop, json_schema_input_type=NonEmpty | list[NonEmpty]
                                     | None)]


class ApiBody(BaseModel):
    """Every request body: unknown fields are ignored; ``model`` is checked first."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: String | None = Field(None, description="must equal the served name (else 404)")

    @field_validator("model")
    @classmethod
    def _served(cls, model: str | None, info: ValidationInfo) -> str | None:
        served = info.context if isinstance(info.context, Served) else Served()
        if model is not None and not served.accepts(model):
            raise refuse(f"model {model!r} does not exist; this server serves "
                         f"{served.model!r}", code="model_not_found")
        return model


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
    stop: Stop = None
    stop_token_ids: list[NonNegative] | None = None
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
        """The sampling parameters (unset fields take SamplingParams' defaults).

        Raises:
            RequestFieldError: SamplingParams refused a value (the schema should have).
        """
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


def _metadata(value: Any) -> Any:
    if value is not None:
        try:
            RequestMeta(metadata=value)
        except ValueError as exc:
            raise refuse(str(exc)) from None
    return value


#: ``metadata``: read by :class:`RequestMeta`'s own check, described by its input type.
Metadata = Annotated[Any, PlainValidator(_metadata, json_schema_input_type=Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=MAX_METADATA_KEY_CHARS)],
         Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)]],
    Field(max_length=MAX_METADATA_PAIRS),
] | None)]


class MetaFields(ApiBody):
    """What a scheduling policy may know of a request besides its tokens (see
    :class:`~aioserve.request_meta.RequestMeta`)."""

    priority: Integer | None = Field(
        None, ge=PRIORITY_MIN, le=PRIORITY_MAX,
        description="lower is served first (vLLM's extra field); default 0")
    user: String | None = Field(
        None, max_length=MAX_TENANT_CHARS,
        description="who sends the request: the tenant scheduling policies see (an "
        "X-Tenant header wins over it; empty: none)")
    ttft_slo_ms: Number | None = Field(None, gt=0.0, description="time-to-first-token "
                                       "objective, milliseconds")
    tpot_slo_ms: Number | None = Field(None, gt=0.0, description="time-per-output-token "
                                       "objective, milliseconds")
    deadline: Number | None = Field(None, gt=0.0, description="absolute time by which the "
                                    "request should have finished, Unix seconds")
    metadata: Metadata = Field(
        None, description="free string pairs passed to scheduling policies untouched")

    def request_meta(self, tenant_header: str | None) -> RequestMeta:
        """The request's :class:`RequestMeta`; ``tenant_header`` (``X-Tenant``) wins
        over ``user``; an empty one means none.

        Raises:
            RequestFieldError: the header is not 1 to 256 visible ASCII characters (param
                ``X-Tenant``).
        """
        tenant = self.user or None
        if tenant_header:
            if not TENANT_HEADER.fullmatch(tenant_header):
                raise RequestFieldError("X-Tenant", f"X-Tenant must be 1 to {MAX_TENANT_CHARS} "
                                        "visible ASCII characters (send others in user)")
            tenant = tenant_header
        try:
            return RequestMeta(
                priority=self.priority or 0, tenant=tenant, ttft_slo_ms=self.ttft_slo_ms,
                tpot_slo_ms=self.tpot_slo_ms, deadline=self.deadline,
                metadata=self.metadata or {},
            )
        except ValueError as exc:  # the schema should have refused it first
            raise RequestFieldError(leading_word(str(exc)), str(exc)) from None
