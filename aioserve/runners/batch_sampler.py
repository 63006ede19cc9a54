"""TEMPORARY shim over the old Sampler (replaced by the vectorised sampler)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from aioserve.outputs import TokenLogprob
from aioserve.runners.sampler import Sampler
from aioserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class SampledBatch:
    token_ids: torch.Tensor
    logprobs: list[TokenLogprob | None] | None

    def to_host(self) -> tuple[list[int], list[TokenLogprob | None] | None]:
        return self.token_ids.tolist(), self.logprobs


class BatchSampler:
    def __init__(self, num_slots: int, vocab_size: int, device: torch.device, seed: int) -> None:
        self._sampler = Sampler(device, seed)
        self._params: dict[int, SamplingParams] = {}
        self._history: dict[int, list[int]] = {}
        self._ids: dict[int, str] = {}
        self._count = 0

    def add(self, slot: int, params: SamplingParams, token_ids: Sequence[int],
            num_output_tokens: int) -> None:
        self._count += 1
        self._params[slot] = params
        self._history[slot] = list(token_ids)
        self._ids[slot] = f"s{self._count}"

    def remove(self, slot: int) -> None:
        self._sampler.release([self._ids.get(slot, "")])

    def sample(self, logits: torch.Tensor, slots: torch.Tensor, slot_list: list[int]
               ) -> SampledBatch:
        params = [self._params[s] for s in slot_list]
        penalty = [self._history[s] if p.repetition_penalty != 1.0 else None
                   for s, p in zip(slot_list, params)]
        tokens, logprobs = self._sampler.sample(
            logits, [self._ids[s] for s in slot_list], params, penalty)
        for s, t in zip(slot_list, tokens):
            self._history[s].append(t)
        return SampledBatch(torch.tensor(tokens, dtype=torch.int64, device=logits.device),
                            logprobs)
