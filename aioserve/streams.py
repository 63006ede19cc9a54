"""Per-request output streams: RequestOutput deltas from the step loop to consumers."""

from __future__ import annotations

from aioserve.delta_queue import DeltaQueue
from aioserve.detokenizer import IncrementalDetokenizer
from aioserve.outputs import RequestOutput, TokenLogprob
from aioserve.request import FinishReason, Request


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

    def decode(self, token: int) -> str:
        """Text of one new token that is safe to send now. A token that ended the
        request as a stop token (EOS, ``stop_token_ids``) adds no text."""
        request, detok = self.request, self.detokenizer
        if detok is None or request.finish_reason is FinishReason.STOP:
            return ""
        return detok.add(token)

    @property
    def hit_stop_string(self) -> bool:
        return self.detokenizer is not None and self.detokenizer.stopped

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
        self.queue.put_nowait(
            RequestOutput(
                request_id=request.request_id,
                text=text,
                token_ids=tokens,
                finished=finished,
                finish_reason=request.finish_reason.value
                if finished and request.finish_reason
                else None,
                num_prompt_tokens=request.num_prompt_tokens,
                num_output_tokens=request.num_output_tokens,
                logprobs=logprobs,
                metrics=request.metrics,
                num_cached_tokens=request.num_cached_tokens,
            )
        )

    def push_error(self, error: BaseException) -> None:
        """End the stream with an exception."""
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(error)
