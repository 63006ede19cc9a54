"""BatchBuilder: one step's :class:`ScheduledBatch`, built as the core schedules."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from aioserve.request import Request, RequestStatus
from aioserve.runners.base import NewRequest, ScheduledBatch

#: A scheduled request as the core remembers it until its step ends:
#: (request, its epoch then, tokens fed, whether a token is sampled)
InFlight = tuple[Request, int, int, bool]


class BatchBuilder:
    """The rows of one step, in scheduling order; each request is written once (its row,
    its in-flight counters, its ``record`` row read back by ``EngineCore.update``)."""

    __slots__ = ("max_model_len", "block_size", "_reserve", "request_ids", "_counts", "_starts",
                 "_sample", "_produced", "_new", "record", "finishing")

    def __init__(self, max_model_len: int, block_size: int,
                 reserve: Callable[[Request, int, list[str]], bool]) -> None:
        self.max_model_len = max_model_len
        self.block_size = block_size
        self._reserve = reserve
        self.request_ids: list[str] = []
        self._counts: list[int] = []
        self._starts: list[int] = []
        self._sample: list[bool] = []
        self._produced: list[int] = []
        self._new: list[NewRequest] = []
        self.record: list[InFlight] = []
        self.finishing: list[str] = []

    def add_running(self, running: Iterable[Request], budget: int,
                    chunks: Mapping[str, int] | None = None) -> int:
        """Schedule the requests' next tokens (decode, or the rest of a chunked prefill)
        within ``budget`` and each one's limit in ``chunks`` (id -> most tokens);
        returns the budget left. The per-step hot path: every lookup is bound once."""
        chunks = chunks or None  # one truth test here, not one per request
        ids, counts, starts = self.request_ids, self._counts, self._starts
        block_size, reserve = self.block_size, self._reserve
        sample, produced_list, record = self._sample, self._produced, self.record
        finishing, max_model_len = self.finishing, self.max_model_len
        running_status = RequestStatus.RUNNING
        for request in running:
            if budget <= 0:
                break
            if request.status is not running_status:
                continue
            start = request.num_computed_tokens
            placeholders = request.num_output_placeholders
            produced = len(request.output_token_ids) + placeholders
            total = len(request.prompt_token_ids) + produced
            max_tokens = request.params.max_tokens
            if placeholders and (produced >= max_tokens or total >= max_model_len):
                continue  # its step in flight ends it: nothing more to compute
            count = total - start
            if count > budget:
                count = budget
            if chunks and count > 1 and request.request_id in chunks:
                count = min(count, chunks[request.request_id])
            if count <= 0:
                continue
            # Most decode steps: the request's blocks already hold the new tokens.
            if start + count > len(request.block_ids) * block_size and not reserve(
                request, count, ids
            ):
                continue
            samples = start + count == total
            ids.append(request.request_id)
            counts.append(count)
            starts.append(start)
            sample.append(samples)
            produced_list.append(produced)
            request.num_computed_tokens = start + count
            request.num_in_flight_tokens += count
            if samples:
                request.num_output_placeholders = placeholders + 1
                if produced + 1 >= max_tokens or total + 1 >= max_model_len:
                    finishing.append(request.request_id)
            record.append((request, request.epoch, count, samples))
            budget -= count
        return budget

    def add_new(self, request: Request, count: int) -> None:
        """Schedule a request the runner holds no state for (admitted or readmitted)."""
        self._new.append(NewRequest(
            request.request_id, request.prompt_token_ids + request.output_token_ids,
            len(request.prompt_token_ids), request.params, list(request.block_ids),
            request.num_computed_tokens,
        ))
        self.add_running((request,), count)  # its first chunk's blocks are allocated

    def build(self, new_block_ids: dict[str, list[int]], released_ids: list[str]
              ) -> ScheduledBatch:
        """The batch (plain data)."""
        for new in self._new:  # their NewRequest lists every block
            new_block_ids.pop(new.request_id, None)
        return ScheduledBatch(
            self.request_ids, self._counts, self._starts, self._sample, self._produced,
            self._new, new_block_ids, released_ids,
        )
