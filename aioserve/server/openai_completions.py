"""``POST /v1/completions``: the OpenAI text-completion endpoint."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aioserve.outputs import RequestOutput
from aioserve.server.body import read_json_object
from aioserve.server.errors import ApiError, bad_request
from aioserve.server.logprobs import CompletionLogprobs, TokenText
from aioserve.server.openai_call import ResponseFormat, answer, start_choices
from aioserve.server.params import (
    MAX_SEQUENCES_PER_CALL,
    RequestFieldError,
    call_options,
    get_field,
    integral,
    sampling_params_from_json,
)
from aioserve.server.state import ENGINE_KEY, accepts_model_name, served_model_name


def parse_prompts(value: Any) -> list[str | list[int]]:
    """The ``prompt`` field as a list of prompts: a string, a list of strings, a list
    of token ids, or a list of token-id lists.

    Raises:
        RequestFieldError: missing, empty, or of another shape (param ``prompt``).
    """
    def is_id(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    value = integral(value)
    if isinstance(value, str):
        prompts: list[Any] = [value]
    elif isinstance(value, list) and value and all(is_id(x) for x in value):
        prompts = [value]
    elif isinstance(value, list) and value and all(
        isinstance(p, str) or (isinstance(p, list) and all(is_id(x) for x in p)) for p in value
    ) and len({type(p) for p in value}) == 1:
        prompts = list(value)
    elif value is None:
        raise RequestFieldError("prompt", "prompt is required")
    elif isinstance(value, list) and not value:
        raise RequestFieldError("prompt", "prompt is empty")
    else:
        raise RequestFieldError(
            "prompt",
            "prompt must be a string, a list of strings, a list of token ids, or a list of "
            "token-id lists",
        )
    if any(len(p) == 0 for p in prompts):
        raise RequestFieldError("prompt", "prompt is empty")
    return prompts


class CompletionFormat(ResponseFormat):
    """``text_completion`` choices: ``text``, ``logprobs``, ``finish_reason``."""

    def __init__(self, token_text: TokenText) -> None:
        self._token_text = token_text
        self._text: dict[int, list[str]] = {}
        self._logprobs: dict[int, CompletionLogprobs] = {}
        self._total_logprobs: dict[int, dict[str, Any] | None] = {}

    def _delta_logprobs(self, index: int, out: RequestOutput) -> dict[str, Any] | None:
        if out.logprobs is None:
            return None
        builder = self._logprobs.setdefault(index, CompletionLogprobs(self._token_text))
        return builder.delta(out.logprobs)

    def stream_choice(
        self, index: int, out: RequestOutput | None, finish_reason: str | None
    ) -> dict[str, Any]:
        return {
            "index": index,
            "text": out.text if out is not None else "",
            "logprobs": self._delta_logprobs(index, out) if out is not None else None,
            "finish_reason": finish_reason,
        }

    def add(self, index: int, out: RequestOutput) -> None:
        self._text.setdefault(index, []).append(out.text)
        part = self._delta_logprobs(index, out)
        if part is not None:
            total = self._total_logprobs.get(index)
            self._total_logprobs[index] = CompletionLogprobs.extend(total, part)

    def final_choice(self, index: int, finish_reason: str | None) -> dict[str, Any]:
        return {
            "index": index,
            "text": "".join(self._text.get(index, [])),
            "logprobs": self._total_logprobs.get(index),
            "finish_reason": finish_reason,
        }


def check_model(app: web.Application, body: dict[str, Any]) -> None:
    """Check the ``model`` field against the served name (absent is allowed).

    Raises:
        ApiError: 400 when it is not a string, 404 when it names another model.
    """
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    name = served_model_name(app)
    if not accepts_model_name(app, model):
        raise ApiError(
            404, f"model {model!r} does not exist; this server serves {name!r}",
            param="model", code="model_not_found",
        )


async def create_completion(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``: JSON response, or SSE chunks with ``stream: true``."""
    body = await read_json_object(request)
    check_model(request.app, body)
    try:
        options = call_options(body, request.headers.get("X-Request-Id"))
        prompts = parse_prompts(body.get("prompt"))
        logprobs = get_field(body, "logprobs", (int,))
        params = sampling_params_from_json(body, logprobs=logprobs)
    except RequestFieldError as exc:
        raise bad_request(str(exc), exc.param) from None
    if len(prompts) * options.n > MAX_SEQUENCES_PER_CALL:
        raise bad_request(
            f"n times the number of prompts must be at most {MAX_SEQUENCES_PER_CALL}", "n"
        )
    fmt = CompletionFormat(TokenText(request.app[ENGINE_KEY].tokenizer))
    choices = start_choices(request, prompts, [params] * len(prompts), options, fmt)
    return await answer(request, choices, options, fmt)
