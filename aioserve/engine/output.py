"""Output: each request's stream of RequestOutput deltas, fed once per step."""

from __future__ import annotations

import logging
from typing import Any

from aioserve.detokenizer import IncrementalDetokenizer
from aioserve.engine.core import EngineCore, StepResult
from aioserve.engine.delta_queue import DeltaQueue
from aioserve.errors import EngineError, RequestShedError
from aioserve.outputs import RequestOutput, TokenLogprob
from aioserve.request import FinishReason, Request, RequestStatus
from aioserve.runners.base import RunnerOutput

logger = logging.getLogger(__name__)


_FINISHED = RequestStatus.FINISHED


class RequestStream:
    """One request's delta queue (unbounded: at most ``max_tokens`` deltas) and
    detokenizer; an exception on the queue is raised by the consumer."""

    __slots__ = ("request", "queue", "detokenizer", "closed")

    def __init__(self, request: Request, detokenizer: IncrementalDetokenizer | None) -> None:
        self.request = request
        self.queue: DeltaQueue[RequestOutput | BaseException] = DeltaQueue()
        self.detokenizer = detokenizer
        self.closed = False

    def push_token(self, token: int, text: str, logprob: TokenLogprob | None) -> None:
        """Queue the delta of one new token; the request's status says if it is the last."""
        if self.closed:
            return
        request = self.request
        logprobs = None if logprob is None else [logprob]
        if request.status is _FINISHED:
            self.put([token], text, logprobs)
            return
        self.queue.put_nowait(RequestOutput(  # positional: the cheapest construction
            request.request_id, text, [token], False, None, len(request.prompt_token_ids),
            len(request.output_token_ids), logprobs, request.metrics, None,
            request.num_cached_tokens,
        ))

    def put(self, tokens: list[int], text: str, logprobs: list[TokenLogprob] | None) -> None:
        if self.closed:
            return
        request = self.request
        finished = request.is_finished
        if finished:
            if self.detokenizer is not None and request.finish_reason is not None:
                text += self.detokenizer.finish()  # may raise: the stream stays open
            self.closed = True
        reason = request.finish_reason
        self.queue.put_nowait(RequestOutput(  # positional: the cheapest construction
            request.request_id, text, tokens, finished,
            reason.value if finished and reason is not None else None,
            len(request.prompt_token_ids), len(request.output_token_ids), logprobs,
            request.metrics, None, request.num_cached_tokens,
        ))

    def push_error(self, error: BaseException) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(error)


class Delivery:
    """The open streams of one engine, by request id. A fault while delivering one
    request's output ends that request alone with an error; its batch-mates go on."""

    def __init__(self) -> None:
        self.streams: dict[str, RequestStream] = {}
        self._finished: list[Request] = []

    def open_stream(self, request: Request, tokenizer: Any) -> RequestStream:
        """The stream of a queued request, detokenized if there is a tokenizer."""
        detok = None
        if tokenizer is not None:
            backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
            params = request.params
            detok = IncrementalDetokenizer(backend, request.prompt_token_ids, params.stop,
                                           params.include_stop_str_in_output)
        stream = RequestStream(request, detok)
        self.streams[request.request_id] = stream
        return stream

    def release(self, stream: RequestStream, core: EngineCore | None) -> None:
        """Forget ``stream`` and abort its own request (not the id's) if unfinished."""
        request = stream.request
        if self.streams.get(request.request_id) is stream:
            del self.streams[request.request_id]
        if not stream.closed:
            stream.closed = True
            if core is not None and not request.is_finished:
                core.finish(request, FinishReason.ABORT)
                self.flush_finished(core)

    def on_finish(self, request: Request) -> None:
        self._finished.append(request)

    def fan_out(self, core: EngineCore, output: RunnerOutput, results: list[StepResult]) -> None:
        """Hand every request of a step its token; a stop string finishes it here."""
        streams = self.streams
        logprobs = output.logprobs
        stop, finished = FinishReason.STOP, RequestStatus.FINISHED
        for request, token, index in results:
            stream = streams.get(request.request_id)
            if stream is None or stream.request is not request:  # released, id reused
                continue
            try:
                detok = stream.detokenizer
                text = ""
                # A token that ended the request as a stop token (EOS, stop_token_ids)
                # adds no text.
                if detok is not None and request.finish_reason is not stop:
                    text = detok.add(token)
                    if detok.stopped and request.status is not finished:
                        core.finish(request, stop)
                stream.push_token(token, text, None if logprobs is None else logprobs[index])
            except Exception as exc:  # this request alone ends; its batch-mates go on
                self.fail_request(core, request, stream, exc)

    def flush_finished(self, core: EngineCore) -> None:
        finished, self._finished = self._finished, []
        for request in finished:
            stream = self.streams.get(request.request_id)
            if stream is not None and stream.request is not request:
                stream = None  # another request took the id since
            if stream is not None and not stream.closed and request.refusal is not None:
                stream.push_error(request.refusal)
            elif stream is not None and not stream.closed and request.shed_reason is not None:
                stream.push_error(RequestShedError(
                    f"request shed by the scheduler: {request.shed_reason}"))
            elif stream is not None and not stream.closed:
                try:
                    stream.put([], "", None)
                except Exception as exc:
                    self.fail_request(core, request, stream, exc)

    def fail_request(
        self, core: EngineCore, request: Request, stream: RequestStream, exc: Exception
    ) -> None:
        logger.exception("delivering %s failed", request.request_id)
        stream.push_error(EngineError(f"output processing failed: {type(exc).__name__}: {exc}"))
        if not request.is_finished:
            core.finish(request, FinishReason.ERROR)

    def fail(self, core: EngineCore, requests: list[Request], error: EngineError) -> None:
        """End these requests and their own streams (not their ids') with ``error``."""
        for request in requests:
            stream = self.streams.get(request.request_id)
            if stream is not None and stream.request is request:
                stream.push_error(error)
        core.fail(requests)  # their streams are closed: flush_finished skips them

    def end_all(self, error: EngineError) -> None:
        for stream in list(self.streams.values()):
            stream.push_error(error)
