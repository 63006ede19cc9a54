"""Memory pressure on the real model with a tiny KV cache (CASES.md BUG-06, BUG-08):
preemption by recompute changes no token, a request bigger than the cache is rejected
at once, and a lone request that fills the cache ends with "length"."""

from __future__ import annotations

import asyncio

import pytest
import torch

from aioserve import AsyncEngine, EngineConfig, SamplingParams

TEXTS = (
    "Once upon a time, there was a little girl named Lily",
    "The cat sat on the mat and looked at the bird",
    "Tom and his dog went to the park to play ball",
)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    ids = [tokenizer(text).input_ids[:6] for text in TEXTS]
    assert all(len(p) == 6 for p in ids)
    return ids


@pytest.fixture(scope="module")
def solo(hf_model):
    """transformers generate() alone: greedy, 10 tokens, no EOS, given penalty."""
    cache: dict[tuple[tuple[int, ...], float], list[int]] = {}

    def run(prompt: list[int], penalty: float) -> list[int]:
        key = (tuple(prompt), penalty)
        if key not in cache:
            with torch.inference_mode():
                out = hf_model.generate(
                    torch.tensor([prompt]),
                    max_new_tokens=10,
                    min_new_tokens=10,
                    do_sample=False,
                    eos_token_id=None,
                    repetition_penalty=penalty,
                )
            cache[key] = out[0, len(prompt) :].tolist()
        return cache[key]

    return run


async def collect(engine: AsyncEngine, prompt, params: SamplingParams) -> tuple[list[int], str]:
    tokens: list[int] = []
    reason = ""
    async for out in engine.generate(prompt, params):
        tokens += out.token_ids
        reason = out.finish_reason or reason
    return tokens, reason


@pytest.mark.parametrize("penalty", [1.0, 1.3])
@pytest.mark.parametrize("policy,hint", [("fcfs", None), ("memory_aware", 1), ("spf", None)])
async def test_preemption_changes_no_token(model_dir, prompts, solo, policy, hint, penalty):
    # 6 blocks x 4 tokens: each request needs 4 blocks (6 + 9 tokens), all three 12
    config = EngineConfig(model=model_dir, scheduler=policy, num_kv_blocks=6, block_size=4)
    params = SamplingParams(
        max_tokens=10,
        temperature=0.0,
        ignore_eos=True,
        repetition_penalty=penalty,
        length_hint=hint,
    )
    async with AsyncEngine(config) as engine:
        results = await asyncio.gather(*(collect(engine, p, params) for p in prompts))
        stats = engine.stats()
        chosen = getattr(engine.core.scheduler, "preemptions", None)
    assert stats["num_preemptions"] > 0  # precondition: recompute happened
    if policy == "memory_aware":
        assert chosen == stats["num_preemptions"]  # its own victims, counted
    for prompt, (tokens, reason) in zip(prompts, results):
        assert tokens == solo(prompt, penalty)  # exactly 10, none lost or doubled
        assert reason == "length"
    assert stats["num_free_blocks"] == 6 and stats["num_running"] == stats["num_waiting"] == 0


async def test_memory_aware_admission_avoids_preemption(model_dir, prompts, solo):
    # projecting prompt + max_tokens (no hint), it runs one request at a time here
    config = EngineConfig(model=model_dir, scheduler="memory_aware", num_kv_blocks=6, block_size=4)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    async with AsyncEngine(config) as engine:
        results = await asyncio.gather(*(collect(engine, p, params) for p in prompts))
        assert engine.stats()["num_preemptions"] == 0
    assert [tokens for tokens, _ in results] == [solo(p, 1.0) for p in prompts]


@pytest.mark.parametrize("policy", ["memory_aware", "fcfs"])
async def test_prompt_bigger_than_the_cache_is_rejected_at_once(model_dir, tokenizer, policy):
    # BUG-06 (a): 8 blocks x 16 = 128 tokens, context 512
    config = EngineConfig(model=model_dir, scheduler=policy, num_kv_blocks=8, block_size=16)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    async with AsyncEngine(config) as engine:
        with pytest.raises(ValueError, match=r"8 blocks \(128 tokens\)"):
            await collect(engine, [5] * 200, params)
        tokens, reason = await collect(engine, [5] * 10, params)
        assert (len(tokens), reason) == (10, "length")
        assert engine.stats()["num_free_blocks"] == 8


@pytest.mark.parametrize("policy", ["memory_aware", "fcfs", "spf", "static"])
async def test_lone_request_that_fills_the_cache_ends_with_length(model_dir, policy):
    # BUG-06 (b): 20-token prompt, max_tokens 300, ignore_eos, 128-token cache
    config = EngineConfig(model=model_dir, scheduler=policy, num_kv_blocks=8, block_size=16)
    params = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
    async with AsyncEngine(config) as engine:
        tokens, reason = await collect(engine, [5] * 20, params)
        # 128 positions hold 20 prompt + 108 fed outputs; the 109th is sampled from the last
        assert (len(tokens), reason) == (109, "length")
        assert engine.stats()["num_free_blocks"] == 8 and engine.is_running
        tokens, reason = await collect(engine, [5] * 10, SamplingParams(max_tokens=5))
        assert len(tokens) <= 5 and reason in ("stop", "length")
