"""Vectorised on-device sampling over persistent slots, no host sync."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from aioserve.outputs import TokenLogprob
from aioserve.runners.torch import sampling_ops as ops
from aioserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class LogprobTensors:
    """Log-probabilities on the device of the rows that asked (K top entries, may be 0)."""

    token_logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


@dataclass(frozen=True)
class SampledBatch:
    """One step's tokens ``[R]`` int64 on the device, with logprobs where asked."""

    token_ids: torch.Tensor
    logprobs: LogprobTensors | None
    rows_with_logprobs: list[int]
    num_top: list[int]

    def to_host(self) -> tuple[list[int], list[TokenLogprob | None] | None]:
        """Token ids and one :class:`TokenLogprob` per row (None where not asked), blocking."""
        tokens = self.token_ids.tolist()
        if self.logprobs is None:
            return tokens, None
        chosen = self.logprobs.token_logprobs.tolist()
        top_ids = self.logprobs.top_ids.tolist()
        top_values = self.logprobs.top_logprobs.tolist()
        result: list[TokenLogprob | None] = [None] * len(tokens)
        for j, (row, k) in enumerate(zip(self.rows_with_logprobs, self.num_top)):
            top = tuple(zip(top_ids[j][:k], top_values[j][:k]))
            result[row] = TokenLogprob(tokens[row], chosen[j], top)
        return tokens, result


class BatchSampler:
    """Picks one token per row of logits, all rows at once, on the logits' device.

    Per row: the repetition penalty (transformers' CTRL rule), then greedy ``argmax``, or
    temperature, top-k (ties kept), top-p (after top-k) and the exponential race ``argmax(w /
    q)`` with ``q ~ Exp(1)`` hashed from (seed, draw index, token id). So a token depends only on
    the request's logits, parameters, seed and output index: not on batch-mates, row or
    preemption. ``seed`` seeds the seeds of requests without one."""

    def __init__(self, num_slots: int, vocab_size: int, device: torch.device, seed: int) -> None:
        self.num_slots = num_slots
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self._seeds = torch.Generator().manual_seed(seed)
        floats, ints, device = torch.float32, torch.int64, self.device
        self._temperature = torch.ones(num_slots, dtype=floats, device=device)
        self._top_p = torch.ones(num_slots, dtype=floats, device=device)
        self._penalty = torch.ones(num_slots, dtype=floats, device=device)
        self._top_k = torch.full((num_slots,), vocab_size, dtype=ints, device=device)  # V: off
        self._seed = torch.zeros(num_slots, dtype=ints, device=device)
        self._draw = torch.zeros(num_slots, dtype=ints, device=device)  # next draw's index
        self._offsets = ops.token_offsets(torch.arange(vocab_size, dtype=ints, device=device))
        self._seen: torch.Tensor | None = None  # [num_slots, V] bool, made on first need
        self._params: list[SamplingParams | None] = [None] * num_slots

    def add(
        self, slot: int, params: SamplingParams, token_ids: Sequence[int], num_output_tokens: int
    ) -> None:
        """Give ``slot`` to a request (``token_ids``: the penalty's history)."""
        if not 0 <= slot < self.num_slots or self._params[slot] is not None:
            raise ValueError(f"slot {slot} is not a free slot of {self.num_slots}")
        if params.seed is None:
            seed = int(torch.randint(-(2**63), 2**63 - 1, (), generator=self._seeds))
            params = dataclasses.replace(params, seed=seed)
        self._params[slot] = params
        self._temperature[slot] = params.temperature  # read by non-greedy rows only
        self._top_k[slot] = params.top_k if 0 < params.top_k < self.vocab_size else self.vocab_size
        self._top_p[slot] = params.top_p
        self._penalty[slot] = params.repetition_penalty
        self._seed[slot] = self.seed_of(slot)
        self._draw[slot] = num_output_tokens
        if params.repetition_penalty != 1.0:
            if self._seen is None:
                shape = (self.num_slots, self.vocab_size)
                self._seen = torch.zeros(shape, dtype=torch.bool, device=self.device)
            self._seen[slot] = False
            ids = sorted({t for t in token_ids if 0 <= t < self.vocab_size})
            if ids:
                self._seen[slot, self._to_device(ids)] = True

    def remove(self, slot: int) -> None:
        self._params[slot] = None

    def seed_of(self, slot: int) -> int:
        """The seed ``slot`` draws with (re-add a preempted request with it)."""
        return ops.to_int64(self._slot_params(slot).seed or 0)

    def penalise(
        self, logits: torch.Tensor, slots: torch.Tensor, slot_list: list[int]
    ) -> torch.Tensor:
        """``logits`` with each row's repetition penalty, as transformers' processor."""
        params = [self._slot_params(s) for s in slot_list]
        if self._seen is None or all(p.repetition_penalty == 1.0 for p in params):
            return logits
        penalty = self._penalty.index_select(0, slots).unsqueeze(1)
        cuda = logits.device.type == "cuda"
        lowered = logits * penalty.reciprocal() if cuda else logits / penalty
        penalised = torch.where(logits < 0, logits * penalty, lowered)
        return torch.where(self._seen.index_select(0, slots), penalised, logits)

    def sample(
        self, logits: torch.Tensor, slots: torch.Tensor, slot_list: list[int]
    ) -> SampledBatch:
        """One token per row of ``logits`` ``[R, V]`` for ``slots`` ``[R]``; no host sync."""
        if logits.shape != (len(slot_list), self.vocab_size):
            raise ValueError(f"logits {tuple(logits.shape)} for {len(slot_list)} rows")
        params = [self._slot_params(s) for s in slot_list]
        logits = self.penalise(logits, slots, slot_list)
        drawn = [i for i, p in enumerate(params) if not p.greedy]
        if drawn and len(drawn) == len(params):
            chosen = self._race(logits, slots, params)
        else:
            chosen = ops.greedy(logits)
            if drawn:
                index = self._to_device(drawn)
                race = self._race(logits[index], slots[index], [params[i] for i in drawn])
                chosen.index_copy_(0, index, race)
        asked = [i for i, p in enumerate(params) if p.logprobs is not None]
        num_top = [params[i].logprobs or 0 for i in asked]
        logprobs = None
        if asked:
            rows = self._to_device(asked) if len(asked) < len(params) else None
            sub, sub_chosen = (logits, chosen) if rows is None else (logits[rows], chosen[rows])
            logprobs = self._logprobs(sub, sub_chosen, max(num_top))
        self._draw.index_add_(0, slots, torch.ones_like(slots))
        if self._seen is not None:
            self._seen[slots, chosen] = True
        return SampledBatch(chosen, logprobs, asked, num_top)

    def _slot_params(self, slot: int) -> SamplingParams:
        params = self._params[slot]
        if params is None:
            raise ValueError(f"slot {slot} holds no request")
        return params

    def _to_device(self, values: list[int]) -> torch.Tensor:
        if self.device.type != "cuda":
            return torch.tensor(values, dtype=torch.int64, device=self.device)
        host = torch.tensor(values, dtype=torch.int64, pin_memory=True)
        return host.to(self.device, non_blocking=True)

    def _race(
        self, logits: torch.Tensor, slots: torch.Tensor, params: list[SamplingParams]
    ) -> torch.Tensor:
        """``[R]`` int64 tokens of non-greedy rows: temperature, top-k, top-p, race."""
        scaled = logits / self._temperature.index_select(0, slots).unsqueeze(1)
        weights = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))
        max_k = max((p.top_k for p in params if 0 < p.top_k < self.vocab_size), default=0)
        any_top_p = any(p.top_p < 1.0 for p in params)
        if max_k or any_top_p:
            top_k = self._top_k.index_select(0, slots).unsqueeze(1)
            top_p = self._top_p.index_select(0, slots).unsqueeze(1) if any_top_p else None
            weights.masked_fill_(ops.filtered_out(scaled, top_k, max_k, top_p), 0.0)
        keys = ops.draw_keys(self._seed.index_select(0, slots), self._draw.index_select(0, slots))
        return ops.greedy(weights.div_(ops.exponentials(keys, self._offsets)))

    @staticmethod
    def _logprobs(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> LogprobTensors:
        """Log-softmax of (penalised, untempered) logits ``[L, V]``; ``chosen`` ``[L]``."""
        logprobs = torch.log_softmax(logits, dim=-1)
        token = logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1)
        values, ids = torch.topk(logprobs, k, dim=-1)
        return LogprobTensors(token, ids, values)
