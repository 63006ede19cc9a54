"""``POST /v1/chat/completions``: the OpenAI chat endpoint."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aioserve.engine import AsyncEngine
from aioserve.outputs import RequestOutput
from aioserve.server.body import read_json_object
from aioserve.server.chat_template import ChatTemplate, normalize_messages
from aioserve.server.errors import bad_request
from aioserve.server.logprobs import TokenText, chat_logprobs
from aioserve.server.openai_call import ResponseFormat, answer, start_choices
from aioserve.server.openai_completions import check_model
from aioserve.server.params import (
    RequestFieldError,
    call_options,
    get_field,
    sampling_params_from_json,
)
from aioserve.server.state import CONFIG_KEY, ENGINE_KEY


class ChatFormat(ResponseFormat):
    """``chat.completion`` choices: an assistant ``message`` (``delta`` when streamed)."""

    id_prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, token_text: TokenText) -> None:
        self._token_text = token_text
        self._text: dict[int, list[str]] = {}
        self._logprobs: dict[int, list[dict[str, Any]]] = {}

    def _delta_logprobs(self, out: RequestOutput) -> dict[str, Any] | None:
        if out.logprobs is None:
            return None
        return {"content": chat_logprobs(self._token_text, out.logprobs)}

    def stream_start(self, index: int) -> dict[str, Any] | None:
        return {"index": index, "delta": {"role": "assistant", "content": ""},
                "logprobs": None, "finish_reason": None}

    def stream_choice(
        self, index: int, out: RequestOutput | None, finish_reason: str | None
    ) -> dict[str, Any]:
        return {
            "index": index,
            "delta": {"content": out.text} if out is not None else {},
            "logprobs": self._delta_logprobs(out) if out is not None else None,
            "finish_reason": finish_reason,
        }

    def add(self, index: int, out: RequestOutput) -> None:
        self._text.setdefault(index, []).append(out.text)
        part = self._delta_logprobs(out)
        if part is not None:
            self._logprobs.setdefault(index, []).extend(part["content"])

    def final_choice(self, index: int, finish_reason: str | None) -> dict[str, Any]:
        logprobs = self._logprobs.get(index)
        return {
            "index": index,
            "message": {"role": "assistant", "content": "".join(self._text.get(index, []))},
            "logprobs": {"content": logprobs} if logprobs is not None else None,
            "finish_reason": finish_reason,
        }


def _logprobs_option(body: dict[str, Any]) -> int | None:
    """``logprobs`` (bool) and ``top_logprobs`` (int) as SamplingParams.logprobs."""
    wanted = get_field(body, "logprobs", (bool,), False)
    top = get_field(body, "top_logprobs", (int,))
    if top is not None and not wanted:
        raise RequestFieldError("top_logprobs", "top_logprobs needs logprobs: true")
    if top is not None and not 0 <= top <= 20:
        raise RequestFieldError("top_logprobs", f"top_logprobs must be in [0, 20], got {top}")
    return (top or 0) if wanted else None


def _check_limit(max_tokens: int | None, engine: AsyncEngine) -> None:
    """Check a ``max_tokens`` that ``max_completion_tokens`` overrides (1 to context - 1).

    Raises:
        ApiError: 400 naming ``max_tokens`` when out of range.
    """
    if max_tokens is None or engine.core is None:
        return
    if not 1 <= max_tokens < engine.core.max_model_len:
        raise bad_request(f"max_tokens must be in [1, {engine.core.max_model_len - 1}], "
                          f"got {max_tokens}", "max_tokens")


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``: JSON response, or SSE chunks with ``stream: true``.

    The prompt is the messages rendered by the chat template (``--chat-template`` or
    the tokenizer's); a model with neither answers 400. ``max_completion_tokens``
    (or ``max_tokens``) defaults to the rest of the context.
    """
    body = await read_json_object(request)
    check_model(request.app, body)
    engine = request.app[ENGINE_KEY]
    template = ChatTemplate(engine.tokenizer, request.app[CONFIG_KEY].chat_template)
    try:
        options = call_options(body, request.headers.get("X-Request-Id"))
        messages = normalize_messages(body.get("messages"))
        limit_field = (
            "max_completion_tokens" if body.get("max_completion_tokens") is not None
            else "max_tokens"
        )
        max_tokens = get_field(body, limit_field, (int,))
        if limit_field == "max_completion_tokens":  # max_tokens is checked all the same
            _check_limit(get_field(body, "max_tokens", (int,)), engine)
        logprobs = _logprobs_option(body)
        prompt = template.render(messages)
        if max_tokens is None and engine.core is not None:
            max_tokens = max(1, engine.core.max_model_len - len(prompt))
        params = sampling_params_from_json(
            {**body, "max_tokens": max_tokens}, logprobs=logprobs
        )
    except RequestFieldError as exc:
        message, param = str(exc), exc.param
        if param == "max_tokens" and limit_field != "max_tokens":
            param = limit_field
            message = message.replace("max_tokens", limit_field, 1)
        raise bad_request(message, param) from None
    fmt = ChatFormat(TokenText(engine.tokenizer))
    choices = start_choices(request, [prompt], [params], options, fmt)
    return await answer(request, choices, options, fmt)
