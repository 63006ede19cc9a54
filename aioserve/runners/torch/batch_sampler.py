"""Vectorised on-device sampling over persistent per-request slots: a request holds a
slot (a row ``0..num_slots-1``) from :meth:`BatchSampler.add` to :meth:`~BatchSampler.remove`;
its parameters, seed, draw index and (with a repetition penalty) token history live in
device tensors indexed by slot, so a step samples all rows with batched ops, no host sync.
"""

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
    """Log-probabilities (natural log, on the device) of the rows that asked for them.

    Attributes:
        token_logprobs: ``[L]`` float32, log-probability of each such row's sampled token.
        top_ids: ``[L, K]`` int64 ids of the K most likely tokens, most likely first;
            K (may be 0) is the largest ``logprobs`` asked in the batch.
        top_logprobs: ``[L, K]`` float32, their log-probabilities.
    """

    token_logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


@dataclass(frozen=True)
class SampledBatch:
    """The tokens of one step, still on the device.

    Attributes:
        token_ids: ``[R]`` int64, one sampled token per row.
        logprobs: the rows that asked for log-probabilities; None when none did.
        rows_with_logprobs: the row of each entry of ``logprobs``, ascending.
        num_top: how many top entries each of those rows asked for.
    """

    token_ids: torch.Tensor
    logprobs: LogprobTensors | None
    rows_with_logprobs: list[int]
    num_top: list[int]

    def to_host(self) -> tuple[list[int], list[TokenLogprob | None] | None]:
        """Plain data (blocking copy): the token ids, and one :class:`TokenLogprob` per
        row (None for rows that did not ask), or None when no row asked."""
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

    Per row: the repetition penalty (CTRL rule, as transformers applies it) on the
    tokens of the slot's prompt and outputs; then greedy rows take ``argmax``, and the
    others divide by their temperature, drop tokens outside their top-k (ties with the
    k-th value kept) and outside their top-p nucleus (on the probabilities after
    top-k; the most likely token always kept), and take the exponential race
    ``argmax(w / q)``: ``w = exp(x / T - max)`` is the softmax before normalisation (the
    normaliser cannot change the argmax) and ``q ~ Exp(1)`` comes from
    :mod:`aioserve.runners.torch.sampling_ops`, a hash of (seed, draw index, token id). So a
    request's token depends only on its logits, its parameters, its seed and its
    output index: not on its batch-mates, its row, or a preemption in between.

    Args:
        num_slots: rows of the per-slot tensors (most requests held at once).
        vocab_size: V, the width of the logits.
        device: where the logits and the per-slot tensors live.
        seed: seeds the generator that draws a seed for each request without one
            (so a run is reproducible given this seed and the order of ``add`` calls).
    """

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
        """Give ``slot`` to a request.

        Args:
            slot: a free slot in ``[0, num_slots)``.
            params: the request's sampling parameters.
            token_ids: its prompt and the output tokens known now (the history the
                repetition penalty looks at); ids outside ``[0, V)`` are ignored.
            num_output_tokens: the output index of its next draw (its outputs so far
                when it comes back after a preemption).
        """
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
        """Free ``slot`` (its tensors are overwritten by the next :meth:`add`)."""
        self._params[slot] = None

    def seed_of(self, slot: int) -> int:
        """The int64 seed the request in ``slot`` draws with (drawn at :meth:`add` when
        its params had none): re-add a preempted unseeded request with
        ``dataclasses.replace(params, seed=seed_of(slot))`` to continue its stream."""
        return ops.to_int64(self._slot_params(slot).seed or 0)

    def penalise(
        self, logits: torch.Tensor, slots: torch.Tensor, slot_list: list[int]
    ) -> torch.Tensor:
        """The logits ``[R, V]`` float32 with each row's repetition penalty applied to the
        tokens of its slot's history: ``x / p`` where ``x >= 0``, ``x * p`` where
        ``x < 0``, bit for bit as ``transformers.RepetitionPenaltyLogitsProcessor``
        (which on CUDA multiplies by the float32 reciprocal ``1 / p``). Returns
        ``logits`` itself when no row has a penalty."""
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
        """Sample one token per row, advance each row's draw index and record the token
        in its slot's history; no host sync.

        Args:
            logits: ``[R, V]`` float32 on the device (may be modified in place).
            slots: ``[R]`` int64 on the device, each row's slot (distinct).
            slot_list: the same slots as a host list.
        """
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
        """A host list as an int64 device tensor (pinned, non-blocking copy on CUDA)."""
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
