"""The vectorised slot sampler: exact greedy and penalties, batch- and preemption-invariant
random draws, logprobs, and the distribution of the draws."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from aioserve.runners.torch import sampling_ops as ops
from aioserve.runners.torch.batch_sampler import BatchSampler
from aioserve.sampling_params import SamplingParams

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ],
)
DEVICES = pytest.mark.parametrize("device", ["cpu", CUDA])

V = 512
PROMPT = [3, 17, 17, 200, 511, 42]
X = SamplingParams(
    temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.3, seed=1234, logprobs=3
)


def filter_top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The reference, the per-row sampler's filter (before BatchSampler): a copy of ``row``
    with logits outside top-k and top-p at -inf."""
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


def step_logits(step: int, rows: int = 1, vocab: int = V) -> torch.Tensor:
    """Fixed random logits ``[rows, vocab]`` for a step (mixed signs)."""
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, vocab, generator=gen) * 3


def sample(sampler: BatchSampler, logits: torch.Tensor, slot_list: list[int]):
    device = sampler.device
    slots = torch.tensor(slot_list, dtype=torch.int64, device=device)
    return sampler.sample(logits.to(device), slots, slot_list).to_host()


def run_alone(device: str, params: SamplingParams, steps: range, seed: int = 0):
    """Tokens and logprobs of ``params`` sampled alone in slot 0."""
    sampler = BatchSampler(4, V, torch.device(device), seed=seed)
    sampler.add(0, params, PROMPT, 0)
    tokens, logprobs = [], []
    for step in steps:
        (token,), lp = sample(sampler, step_logits(step), [0])
        tokens.append(token)
        logprobs.append(lp[0] if lp else None)
    return tokens, logprobs


@DEVICES
def test_same_tokens_alone_and_in_a_mixed_batch(device):
    alone, alone_lp = run_alone(device, X, range(20))
    assert len(set(alone)) > 5  # really random draws, not a constant
    sampler = BatchSampler(8, V, torch.device(device), seed=99)
    mates = {
        1: SamplingParams(temperature=0, repetition_penalty=1.1),
        2: SamplingParams(temperature=1.0, seed=7),
        4: SamplingParams(temperature=1.2, top_p=0.5, logprobs=2),
        6: SamplingParams(temperature=0, logprobs=0),
    }
    for slot, params in mates.items():
        sampler.add(slot, params, [1, 2, 3, slot], 0)
    sampler.add(5, X, PROMPT, 0)
    order = torch.Generator().manual_seed(5)
    batched, batched_lp = [], []
    for step in range(20):
        slot_list = [5, *mates]
        slot_list = [slot_list[i] for i in torch.randperm(5, generator=order).tolist()]
        logits = step_logits(10_000 + step, rows=5)
        row = slot_list.index(5)
        logits[row] = step_logits(step)[0]
        tokens, lps = sample(sampler, logits, slot_list)
        batched.append(tokens[row])
        batched_lp.append(lps[row])
        assert [lp is None for lp in lps] == [s not in (4, 5, 6) for s in slot_list]
    assert batched == alone
    assert batched_lp == alone_lp


@DEVICES
@pytest.mark.parametrize("seed", [1234, None])
def test_readded_request_continues_as_if_uninterrupted(device, seed):
    params = dataclasses.replace(X, seed=seed)
    expected, _ = run_alone(device, params, range(20), seed=5)
    sampler = BatchSampler(4, V, torch.device(device), seed=5)
    sampler.add(0, params, PROMPT, 0)
    got = [sample(sampler, step_logits(step), [0])[0][0] for step in range(8)]
    kept_seed = sampler.seed_of(0)
    sampler.remove(0)
    other = SamplingParams(temperature=0.5, repetition_penalty=2.0)  # dirties slot 0
    sampler.add(0, other, list(range(100)), 3)
    sample(sampler, step_logits(77), [0])
    sampler.remove(0)
    sampler.add(2, dataclasses.replace(params, seed=kept_seed), PROMPT + got, 8)
    got += [sample(sampler, step_logits(step), [2])[0][0] for step in range(8, 20)]
    assert got == expected


@DEVICES
def test_greedy_is_argmax_first_max(device):
    sampler = BatchSampler(3, V, torch.device(device), seed=0)
    sampler.add(0, SamplingParams(temperature=0), [], 0)
    sampler.add(2, SamplingParams(temperature=1e-6, seed=3), [], 0)
    logits = step_logits(1, rows=2)
    logits[1, 10] = logits[1, 300] = 100.0  # a tie: the first index wins
    tokens, _ = sample(sampler, logits.clone(), [0, 2])
    assert tokens == [int(logits[0].argmax()), 10]


@DEVICES
@pytest.mark.parametrize("filters", [{"top_k": 1}, {"top_p": 1e-6}, {"top_k": 1, "top_p": 0.5}])
def test_top_k_1_and_tiny_top_p_are_greedy(device, filters):
    sampler = BatchSampler(4, V, torch.device(device), seed=0)
    for slot in range(4):
        sampler.add(slot, SamplingParams(temperature=1.5, seed=slot, **filters), [], 0)
    for step in range(10):
        logits = step_logits(step, rows=4)
        tokens, _ = sample(sampler, logits.clone(), [3, 1, 0, 2])
        assert tokens == logits.argmax(dim=-1).tolist()


@DEVICES
def test_repetition_penalty_matches_transformers(device):
    dev = torch.device(device)
    sampler = BatchSampler(6, V, dev, seed=0)
    gen = torch.Generator().manual_seed(3)
    penalties = {0: 1.3, 1: 0.7, 3: 1.0, 4: 2.5, 5: 1.05}
    history = {s: torch.randint(0, V, (30,), generator=gen).tolist() for s in penalties}
    history[5] = []
    for slot, penalty in penalties.items():
        params = SamplingParams(temperature=0, repetition_penalty=penalty)
        sampler.add(slot, params, history[slot], 0)
    slot_list = [4, 0, 5, 1, 3]
    slots = torch.tensor(slot_list, device=dev)
    for step in range(5):
        logits = step_logits(step, rows=5).to(dev)
        logits[:, :20] = 0.0  # zero logits are neither raised nor lowered
        expected = torch.cat([
            RepetitionPenaltyLogitsProcessor(penalties[s])(
                torch.tensor([history[s] or [V]], device=dev), logits[i : i + 1].clone()
            )
            for i, s in enumerate(slot_list)
        ])
        got = sampler.penalise(logits.clone(), slots, slot_list)
        assert not torch.equal(got, logits)
        assert torch.equal(got, expected)
        tokens = sampler.sample(logits, slots, slot_list).token_ids.tolist()
        assert tokens == expected.argmax(dim=-1).tolist()
        for token, slot in zip(tokens, slot_list):
            history[slot].append(token)


@DEVICES
def test_logprobs_are_log_softmax_of_the_penalised_logits(device):
    dev = torch.device(device)
    sampler = BatchSampler(4, V, dev, seed=0)
    sampler.add(0, SamplingParams(temperature=0.7, seed=1, logprobs=5), [], 0)
    sampler.add(1, SamplingParams(temperature=1.0, seed=2), [], 0)
    sampler.add(2, SamplingParams(temperature=0, logprobs=0, repetition_penalty=1.5), PROMPT, 0)
    sampler.add(3, SamplingParams(temperature=1.0, seed=4, logprobs=2), [], 0)
    slot_list = [0, 1, 2, 3]
    logits = step_logits(0, rows=4).to(dev)
    slots = torch.tensor(slot_list, device=dev)
    expected = torch.log_softmax(sampler.penalise(logits.clone(), slots, slot_list), dim=-1)
    tokens, lps = sampler.sample(logits, slots, slot_list).to_host()
    assert lps[1] is None
    for row, k in [(0, 5), (2, 0), (3, 2)]:
        entry = lps[row]
        assert entry.token_id == tokens[row]
        assert entry.logprob == pytest.approx(float(expected[row, tokens[row]]), abs=1e-6)
        values, ids = torch.topk(expected[row], k)
        assert [i for i, _ in entry.top] == ids.tolist()
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=1e-6)
    assert lps[2].logprob == pytest.approx(float(expected[2].max()), abs=1e-6)  # greedy


@DEVICES
def test_different_seeds_draw_different_tokens(device):
    first, _ = run_alone(device, dataclasses.replace(X, seed=1), range(20))
    second, _ = run_alone(device, dataclasses.replace(X, seed=2), range(20))
    assert first != second
    unseeded = dataclasses.replace(X, seed=None)
    assert run_alone(device, unseeded, range(20), seed=8) == run_alone(
        device, unseeded, range(20), seed=8
    )
    assert run_alone(device, unseeded, range(20), seed=8) != run_alone(
        device, unseeded, range(20), seed=9
    )


@DEVICES
def test_filter_is_the_current_samplers(device):
    """Row by row against the per-row sampler's ``filter_top_k_top_p``."""
    gen = torch.Generator().manual_seed(11)
    scaled = (torch.randn(40, V, generator=gen) * 2).to(device)
    ks = torch.randint(0, 60, (40,), generator=gen).tolist()
    ps = [1.0 if i % 3 == 0 else 0.05 + 0.9 * i / 40 for i in range(40)]
    top_k = torch.tensor([[k if k > 0 else V] for k in ks], device=device)
    top_p = torch.tensor([[p] for p in ps], device=device)
    got = ops.filtered_out(scaled, top_k, max(ks), top_p)
    for i in range(40):
        expected = filter_top_k_top_p(scaled[i], ks[i], ps[i]) == float("-inf")
        assert torch.equal(got[i], expected), i
    kept = (~got).sum(dim=1).tolist()
    assert min(kept) >= 1 and len(set(kept)) > 10  # the masks are not trivial


@DEVICES
def test_filter_keeps_ties_and_ignores_batch_mates(device):
    row = torch.tensor([[0.0, 5.0, 4.0, 1.0, 4.0, 4.0, -1.0, 2.0]], device=device)
    k2 = torch.tensor([[2]], device=device)
    alone = ops.filtered_out(row, k2, 2, None)
    assert alone[0].tolist() == [True, False, False, True, False, False, True, True]
    mates = torch.cat([row, torch.randn(3, 8, device=device)])
    ks = torch.tensor([[2], [7], [8], [1]], device=device)
    ps = torch.tensor([[1.0], [0.3], [0.9], [1.0]], device=device)
    assert torch.equal(ops.filtered_out(mates, ks, 7, ps)[0], alone[0])
    nucleus = ops.filtered_out(row, k2, 2, torch.tensor([[0.5]], device=device))
    # mass before the first 4 is e / (e + 3) < 0.5: it stays, ties after it (index order) go
    assert nucleus[0].tolist() == [True, False, False, True, True, True, True, True]
    peaked = torch.tensor([[40.0, 0, 0, 0, 0, 0, 0, 0], [40.0, 0, 0, 0, 0, 0, 0, 0]], device=device)
    eight = torch.tensor([[8], [8]], device=device)  # probabilities after the first round to 0
    mask = ops.filtered_out(peaked, eight, 0, torch.tensor([[1.0], [0.5]], device=device))
    assert mask.tolist() == [[False] * 8, [False] + [True] * 7]  # top_p 1 drops nothing


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    keep = (torch.cumsum(probs, 0) - probs) < top_p  # LOGITS are sorted already
    return torch.where(keep, probs, 0) / torch.where(keep, probs, 0).sum()


@DEVICES
@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"temperature": 1.0}, torch.softmax(LOGITS, 0)),
        ({"temperature": 0.5, "top_k": 3}, torch.softmax(torch.cat([LOGITS[:3] / 0.5,
                                                                     torch.full((3,), -1e9)]), 0)),
        ({"temperature": 1.0, "top_p": 0.8}, _nucleus(torch.softmax(LOGITS, 0), 0.8)),
    ],
)
def test_draws_follow_the_filtered_softmax(device, params, expected):
    """10,000 draws (20 seeds x 500 draw indices) of a fixed seed set: deterministic, so
    the 0.025 bound (at least 5 standard deviations) cannot flake."""
    sampler = BatchSampler(20, 6, torch.device(device), seed=0)
    for slot in range(20):
        sampler.add(slot, SamplingParams(seed=slot, **params), [], 0)
    slot_list = list(range(20))
    logits = LOGITS.repeat(20, 1)
    counts = torch.zeros(6)
    for _ in range(500):
        tokens, _ = sample(sampler, logits.clone(), slot_list)
        counts += torch.bincount(torch.tensor(tokens), minlength=6)
    freq = counts / counts.sum()
    assert torch.all(counts[expected == 0] == 0)
    assert (freq - expected).abs().max() < 0.025


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sample_does_not_sync_with_the_device():
    dev = torch.device("cuda")
    sampler = BatchSampler(8, V, dev, seed=0)
    sampler.add(0, X, PROMPT, 0)
    sampler.add(3, SamplingParams(temperature=0, repetition_penalty=1.2), PROMPT, 0)
    sampler.add(5, SamplingParams(temperature=0.9, top_k=10, logprobs=1), [], 0)
    sampler.add(6, SamplingParams(temperature=0), [], 0)
    slot_list = [6, 0, 5, 3]
    slots = torch.tensor(slot_list, device=dev)
    logits = step_logits(0, rows=4).to(dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch = sampler.sample(logits, slots, slot_list)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    tokens, lps = batch.to_host()
    assert len(tokens) == 4 and [lp is None for lp in lps] == [True, False, False, True]
