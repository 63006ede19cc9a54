"""``POST /v1/chat/completions``: the OpenAI chat endpoint."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aioserve.outputs import RequestOutput
from aioserve.server.errors import ApiError
from aioserve.server.logprobs import TokenText, chat_logprobs
from aioserve.server.openai.call import (
    ResponseFormat,
    answer,
    refused,
    served,
    start_choices,
)
from aioserve.server.openai.chat_template import ChatTemplate
from aioserve.server.pipeline import read_json_object
from aioserve.server.schema import ChatCompletionRequest, RequestFieldError, parse
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


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``: JSON response, or SSE chunks with ``stream: true``.

    The prompt is the messages rendered by the chat template (``--chat-template`` or
    the tokenizer's); a model with neither answers 400. ``max_completion_tokens``
    (or ``max_tokens``) defaults to the rest of the context.
    """
    body = await read_json_object(request)
    engine = request.app[ENGINE_KEY]
    template = ChatTemplate(engine.tokenizer, request.app[CONFIG_KEY].chat_template)
    try:
        call = parse(ChatCompletionRequest, body, served(request.app))
        options = call.call_options(request.headers.get("X-Request-Id"))
        meta = call.request_meta(request.headers.get("X-Tenant"))
        prompt = template.render(call.messages)
        max_tokens = getattr(call, call.limit_field)
        if max_tokens is None and engine.core is not None:
            max_tokens = max(1, engine.core.max_model_len - len(prompt))
        params = call.sampling_params(max_tokens=max_tokens, logprobs=call.logprobs_option)
    except RequestFieldError as exc:
        raise refused(exc) from None
    fmt = ChatFormat(TokenText(engine.tokenizer))
    try:
        choices = start_choices(request, [prompt], [params], options, fmt, meta)
    except ApiError as exc:  # the engine's context check names max_tokens
        if exc.param == "max_tokens" and call.limit_field != "max_tokens":
            exc.param, exc.message = call.limit_field, exc.message.replace(
                "max_tokens", call.limit_field, 1)
        raise
    return await answer(request, choices, options, fmt)
