"""``POST /v1/completions``: the OpenAI text-completion endpoint."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aioserve.outputs import RequestOutput
from aioserve.server.logprobs import CompletionLogprobs, TokenText
from aioserve.server.openai.call import (
    ResponseFormat,
    answer,
)
from aioserve.server.pipeline import read_body, start, stop_after_header, validate
from aioserve.server.schema import CompletionRequest
from aioserve.server.state import ENGINE_KEY


class CompletionFormat(ResponseFormat):
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


async def create_completion(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``: JSON response, or SSE chunks with ``stream: true``."""
    call = validate(CompletionRequest, await read_body(request), request.app)
    request_id = call.call_id(request.headers.get("X-Request-Id"))
    meta = call.request_meta(request.headers.get("X-Tenant"))
    params = call.sampling_params(logprobs=call.logprobs)
    engine = request.app[ENGINE_KEY]
    stop_after = stop_after_header(request.headers.get("X-Stop-After"))
    streams = start(engine, call.prompt, params, call.n or 1, f"cmpl-{request_id}", meta,
                    request_id, stop_after)
    fmt = CompletionFormat(TokenText(engine.tokenizer))
    return await answer(request, streams, call, request_id, fmt)
