"""``POST /v1/chat/completions``: the OpenAI chat endpoint, and its chat template."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aioserve.outputs import RequestOutput
from aioserve.server.errors import ApiError
from aioserve.server.logprobs import TokenText, chat_logprobs
from aioserve.server.openai.call import ResponseFormat, answer
from aioserve.server.pipeline import read_body, start, stop_after_header, validate
from aioserve.server.schema import responses
from aioserve.server.schema.requests import ChatCompletionRequest, RequestFieldError
from aioserve.server.state import CONFIG_KEY, ENGINE_KEY


class ChatTemplate:
    """Renders chat messages with the tokenizer's chat template, or ``override``."""

    def __init__(self, tokenizer: Any, override: str | None) -> None:
        self._tokenizer = tokenizer
        self._override = override

    @property
    def available(self) -> bool:
        """Whether chat requests can be rendered."""
        if self._tokenizer is None:
            return False
        return bool(self._override or getattr(self._tokenizer, "chat_template", None))

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt token ids of ``messages`` with the generation prompt (no BOS added);
        RequestFieldError (``messages``) without a template or when it fails."""
        if not self.available:
            raise RequestFieldError(
                "messages",
                "this model has no chat template; start the server with --chat-template "
                "FILE (examples/chat_template.jinja in the aioserve repository is one to "
                "start from), or use /v1/completions",
            )
        from jinja2 import TemplateError

        try:
            text = self._tokenizer.apply_chat_template(
                messages, chat_template=self._override, tokenize=False,
                add_generation_prompt=True,
            )
        except TemplateError as exc:
            raise RequestFieldError("messages", f"the chat template failed: {exc}") from None
        if not isinstance(text, str) or not text:
            raise RequestFieldError("messages", "the chat template rendered an empty prompt")
        return list(self._tokenizer(text, add_special_tokens=False).input_ids)


class ChatFormat(ResponseFormat):
    id_prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    response_model = responses.ChatCompletion

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
    call = validate(ChatCompletionRequest, await read_body(request), request.app)
    request_id = call.call_id(request.headers.get("X-Request-Id"))
    meta = call.request_meta(request.headers.get("X-Tenant"))
    engine = request.app[ENGINE_KEY]
    prompt = ChatTemplate(engine.tokenizer, request.app[CONFIG_KEY].chat_template).render(
        [message.as_text() for message in call.messages])
    max_tokens = getattr(call, call.limit_field)
    if max_tokens is None and engine.core is not None:
        max_tokens = max(1, engine.core.max_model_len - len(prompt))
    params = call.sampling_params(max_tokens=max_tokens, logprobs=call.logprobs_option)
    try:
        streams = start(engine, [prompt], params, call.n or 1, f"chatcmpl-{request_id}",
                        meta, request_id, stop_after_header(request.headers.get("X-Stop-After")))
    except ApiError as exc:  # the engine's context check names max_tokens
        if exc.param == "max_tokens" and call.limit_field != "max_tokens":
            exc.param, exc.message = call.limit_field, exc.message.replace(
                "max_tokens", call.limit_field, 1)
        raise
    fmt = ChatFormat(TokenText(engine.tokenizer))
    return await answer(request, streams, call, request_id, fmt)
