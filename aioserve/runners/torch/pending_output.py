"""PendingOutput: a launched step's sampled tokens, until the host has them."""

from __future__ import annotations

import numpy as np
import torch

from aioserve.outputs import TokenLogprob
from aioserve.runners.base import RunnerOutput
from aioserve.runners.torch.batch_sampler import SampledBatch


class PendingOutput:
    """A launched step's sampled tokens ``sampled`` for ``sample_rows``, copied on CUDA into the
    pinned ``host`` buffer."""

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
        """Wait for this step's tokens (not later steps'); -1 for rows that did not sample."""
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
