"""Per-request output streams: RequestOutput deltas from the step loop to consumers."""

from __future__ import annotations

from aioserve.detokenizer import IncrementalDetokenizer
from aioserve.engine.delta_queue import DeltaQueue
from aioserve.outputs import RequestOutput, TokenLogprob
from aioserve.request import Request, RequestStatus

_FINISHED = RequestStatus.FINISHED


class RequestStream:
    """One request's delivery queue and detokenizer.

    Deltas are queued without bound (a request yields at most ``max_tokens`` of
    them); an exception put on the queue is raised by the consumer.
    """

    __slots__ = ("request", "queue", "detokenizer", "closed")

    def __init__(self, request: Request, detokenizer: IncrementalDetokenizer | None) -> None:
        self.request = request
        self.queue: DeltaQueue[RequestOutput | BaseException] = DeltaQueue()
        self.detokenizer = detokenizer
        self.closed = False

    def push_token(self, token: int, text: str, logprob: TokenLogprob | None) -> None:
        """Queue the delta of one new token (``text``: its detokenized text, maybe "");
        the request's status says whether it is the last."""
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

    def push_final(self) -> None:
        """Queue the last delta of a request that ended without a new token."""
        self.put([], "", None)

    def put(self, tokens: list[int], text: str, logprobs: list[TokenLogprob] | None) -> None:
        """Queue a delta; the request's status says whether it is the last."""
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
        """End the stream with an exception."""
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(error)
