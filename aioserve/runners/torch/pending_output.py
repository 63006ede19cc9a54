"""PendingOutput: a launched step's sampled tokens, until the host has them."""

from __future__ import annotations

import numpy as np
import torch

from aioserve.outputs import TokenLogprob
from aioserve.runners.base import RunnerOutput
from aioserve.runners.torch.batch_sampler import SampledBatch


class PendingOutput:
    """The result of a launched step, turned into plain data by :meth:`result`.

    Args:
        num_rows: requests in the step (B).
        sample_rows: ``[S]`` int64 numpy, the rows that sampled (None: none did).
        sampled: their tokens (and logprobs) on the device.
        host: on CUDA, a pinned host buffer ``[S]`` int64 the tokens are being copied
            into and the event recorded after the copy; None: read ``sampled``.
    """

    __slots__ = ("num_rows", "sample_rows", "sampled", "host")

    def __init__(
        self, num_rows: int, sample_rows: np.ndarray | None, sampled: SampledBatch | None,
        host: tuple[torch.Tensor, torch.cuda.Event] | None,
    ) -> None:
        self.num_rows = num_rows
        self.sample_rows = sample_rows
        self.sampled = sampled
        self.host = host

    def result(self) -> RunnerOutput:
        """Wait for the step's tokens and return them per row (-1 where the row did
        not sample), with logprobs where asked. Blocks until the device is done with
        this step (not with steps launched after it)."""
        tokens = [-1] * self.num_rows
        if self.sampled is None or self.sample_rows is None:
            return RunnerOutput(token_ids=tokens)
        logprobs: list[TokenLogprob | None] | None = None
        if self.host is not None and self.sampled.logprobs is None:
            buffer, event = self.host
            event.synchronize()
            sampled = buffer.tolist()
        else:
            sampled, row_logprobs = self.sampled.to_host()
            if row_logprobs is not None:
                logprobs = [None] * self.num_rows
                for row, entry in zip(self.sample_rows.tolist(), row_logprobs):
                    logprobs[row] = entry
        for row, token in zip(self.sample_rows.tolist(), sampled):
            tokens[row] = token
        return RunnerOutput(token_ids=tokens, logprobs=logprobs)
