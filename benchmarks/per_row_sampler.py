"""The per-row sampler used before BatchSampler: a baseline and the tests' reference."""

from __future__ import annotations

import torch

from aioserve.outputs import TokenLogprob
from aioserve.sampling_params import SamplingParams


def apply_repetition_penalty(row: torch.Tensor, token_ids: list[int], penalty: float) -> None:
    """In place on ``row``: the CTRL repetition penalty on seen tokens."""
    ids = torch.tensor(sorted(set(token_ids)), dtype=torch.int64, device=row.device)
    seen = row[ids]
    row[ids] = torch.where(seen > 0, seen / penalty, seen * penalty)


def filter_top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """A copy of ``row`` with logits outside top-k and top-p at -inf."""
    if top_k > 0 and top_k < row.numel():
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop = mass_before >= top_p
        drop[0] = False
        row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return row


class Sampler:
    """One token per row: a ``torch.Generator`` per seeded request, the exponential race."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self._shared = torch.Generator(device=device).manual_seed(seed)
        self._seeded: dict[str, torch.Generator] = {}

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._seeded.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._shared
        gen = self._seeded.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
            self._seeded[request_id] = gen
        return gen

    def sample(
        self,
        logits: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        penalty_token_ids: list[list[int] | None],
    ) -> tuple[list[int], list[TokenLogprob | None] | None]:
        """Token ids of ``logits`` ``[rows, vocab]`` and per-row logprobs or None."""
        for i, tokens in enumerate(penalty_token_ids):
            if tokens:
                apply_repetition_penalty(logits[i], tokens, params[i].repetition_penalty)
        chosen = logits.argmax(dim=-1)
        for i, p in enumerate(params):
            if not p.greedy:
                chosen[i] = self._sample_row(logits[i], request_ids[i], p)
        token_ids = chosen.tolist()
        if all(p.logprobs is None for p in params):
            return token_ids, None
        return token_ids, self._logprobs(logits, token_ids, params)

    def _sample_row(self, row: torch.Tensor, request_id: str, params: SamplingParams) -> int:
        row = filter_top_k_top_p(row / params.temperature, params.top_k, params.top_p)
        probs = torch.softmax(row, dim=-1)
        race = torch.empty_like(probs).exponential_(generator=self._generator(request_id, params))
        return int(torch.argmax(probs / race))

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, token_ids: list[int], params: list[SamplingParams]
    ) -> list[TokenLogprob | None]:
        logprobs = torch.log_softmax(logits, dim=-1)
        result: list[TokenLogprob | None] = []
        for i, p in enumerate(params):
            if p.logprobs is None:
                result.append(None)
                continue
            top: tuple[tuple[int, float], ...] = ()
            if p.logprobs > 0:
                values, ids = torch.topk(logprobs[i], p.logprobs)
                top = tuple(zip(ids.tolist(), values.tolist()))
            result.append(TokenLogprob(token_ids[i], float(logprobs[i, token_ids[i]]), top))
        return result
