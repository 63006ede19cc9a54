"""The engine requests behind one API call: one per (prompt, sample) pair, read as a
single stream of ``(choice index, RequestOutput)``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from aioserve.engine import AsyncEngine
from aioserve.engine.output import RequestStream
from aioserve.outputs import RequestOutput
from aioserve.request_meta import RequestMeta
from aioserve.sampling_params import SamplingParams

#: A prompt as the engine takes it: text or token ids.
Prompt = str | list[int]


def sample_params(params: SamplingParams, sample: int) -> SamplingParams:
    """Parameters of the ``sample``-th of n samples: a seeded request gets
    ``seed + sample``, so the n samples differ and each is reproducible."""
    if params.seed is None or sample == 0:
        return params
    return replace(params, seed=params.seed + sample)


class Choices:
    """All engine requests of one call, started together or not at all.

    Choice ``i`` is prompt ``i // n``, sample ``i % n`` (the OpenAI numbering). Leave
    with :meth:`close` (also on error or cancellation): it aborts every unfinished
    request at once, freeing its slot and KV blocks.

    Args:
        engine: a running engine.
        prompts: the prompts, text or token ids.
        params: sampling parameters per prompt.
        n: samples per prompt.
        call_id: prefix of the engine request ids (``{call_id}-{choice}``).
        meta: what scheduling policies may know of the call's requests (priority,
            tenant, objectives, metadata), the same for each; None: the defaults.

    Raises:
        ValueError: a prompt or parameter the engine rejects, or an id in use; no
            request of the call is left running.
        EngineNotRunningError: the engine is not running.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        prompts: Sequence[Prompt],
        params: Sequence[SamplingParams],
        n: int,
        call_id: str,
        meta: RequestMeta | None = None,
    ) -> None:
        self.engine = engine
        self.n = n
        self.streams: list[RequestStream] = []
        self._tasks: list[asyncio.Task[None]] = []
        try:
            for index in range(len(prompts) * n):
                prompt, sample = prompts[index // n], index % n
                stream = engine.add_request(
                    prompt, sample_params(params[index // n], sample), f"{call_id}-{index}",
                    meta=meta,
                )
                self.streams.append(stream)
        except BaseException:
            self.close()
            raise

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the call, each prompt counted once (not once per sample)."""
        return sum(s.request.num_prompt_tokens for s in self.streams[:: self.n])

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache, counted as :attr:`prompt_tokens`."""
        return sum(s.request.num_cached_tokens for s in self.streams[:: self.n])

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        """The call's OpenAI ``usage`` object, given its generated tokens in all."""
        prompt = self.prompt_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Outputs of every choice as they come, until all have finished.

        Raises:
            EngineError: a model step failed for one of the choices.
        """
        if len(self.streams) == 1:
            queue = self.streams[0].queue
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield 0, item
                if item.finished:
                    return
        merged: asyncio.Queue[tuple[int, RequestOutput | BaseException]] = asyncio.Queue()
        self._tasks = [
            asyncio.create_task(self._forward(index, stream, merged))
            for index, stream in enumerate(self.streams)
        ]
        remaining = len(self.streams)
        while remaining:
            index, item = await merged.get()
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                remaining -= 1
            yield index, item

    @staticmethod
    async def _forward(
        index: int,
        stream: RequestStream,
        merged: asyncio.Queue[tuple[int, RequestOutput | BaseException]],
    ) -> None:
        while True:
            item = await stream.queue.get()
            merged.put_nowait((index, item))
            if isinstance(item, BaseException) or item.finished:
                return

    def close(self) -> None:
        """Abort every unfinished request of the call and stop reading (idempotent)."""
        for task in self._tasks:
            task.cancel()
        for stream in self.streams:
            self.engine.release(stream)
