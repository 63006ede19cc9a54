"""BatchBuilder: one step's :class:`ScheduledBatch`, built as the core schedules.

Each scheduled request is written once: its row of the batch (id, tokens to compute,
start position, sample flag, output index), its counters advanced by what is now in
flight, and the core's record of the step (read back by ``EngineCore.update``).
"""

from __future__ import annotations

from aioserve.request import Request
from aioserve.runners.base import NewRequest, ScheduledBatch

#: A scheduled request as the core remembers it until its step ends:
#: (request, its epoch then, tokens fed, whether a token is sampled)
InFlight = tuple[Request, int, int, bool]


class BatchBuilder:
    """The rows of one step, in the order requests are scheduled.

    Args:
        max_model_len: context length in tokens (a request reaching it ends).

    Attributes:
        request_ids: the scheduled requests so far.
        record: the in-flight record of each row.
        finishing: ids of requests whose last token this step samples (``max_tokens``
            or the context length reached), filled as rows are added.
    """

    __slots__ = ("max_model_len", "request_ids", "_counts", "_starts", "_sample", "_produced",
                 "_new", "record", "finishing")

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.request_ids: list[str] = []
        self._counts: list[int] = []
        self._starts: list[int] = []
        self._sample: list[bool] = []
        self._produced: list[int] = []
        self._new: list[NewRequest] = []
        self.record: list[InFlight] = []
        self.finishing: list[str] = []

    def add(self, request: Request, count: int, produced: int, total: int) -> None:
        """Schedule ``count`` tokens of ``request`` from its ``num_computed_tokens`` on;
        a token is sampled when they reach ``total``, the end of its tokens. Advances
        its counters by what is now in flight.

        Args:
            produced: its output tokens, placeholders included (the caller has them).
            total: its prompt plus ``produced`` tokens.
        """
        start = request.num_computed_tokens
        placeholders = request.num_output_placeholders
        samples = start + count == total
        self.request_ids.append(request.request_id)
        self._counts.append(count)
        self._starts.append(start)
        self._sample.append(samples)
        self._produced.append(produced)
        request.num_computed_tokens = start + count
        request.num_in_flight_tokens += count
        if samples:
            request.num_output_placeholders = placeholders + 1
            if produced + 1 >= request.params.max_tokens or total + 1 >= self.max_model_len:
                self.finishing.append(request.request_id)
        self.record.append((request, request.epoch, count, samples))

    def add_new(self, request: Request, count: int) -> None:
        """Schedule a request the runner holds no state for (admitted, or readmitted
        after a preemption): its known tokens and blocks go in a :class:`NewRequest`."""
        self._new.append(NewRequest(
            request.request_id, request.prompt_token_ids + request.output_token_ids,
            len(request.prompt_token_ids), request.params, list(request.block_ids),
            request.num_computed_tokens,
        ))
        produced = len(request.output_token_ids)
        self.add(request, count, produced, len(request.prompt_token_ids) + produced)

    def build(self, new_block_ids: dict[str, list[int]], released_ids: list[str]
              ) -> ScheduledBatch:
        """The batch (plain data)."""
        for new in self._new:  # their NewRequest lists every block
            new_block_ids.pop(new.request_id, None)
        return ScheduledBatch(
            self.request_ids, self._counts, self._starts, self._sample, self._produced,
            self._new, new_block_ids, released_ids,
        )
