"""Sampling parameters: validation, greedy limits, seeds independent of the batch (BUG-14)."""

from __future__ import annotations

import asyncio
import math

import pytest

from aioserve import AsyncEngine, EngineConfig, SamplingParams

PROMPT = [1, 403, 407, 261, 378]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -1),
        ("max_tokens", 2.5),
        ("max_tokens", True),
        ("temperature", -1.0),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", math.nan),
        ("top_k", -2),
        ("seed", "7"),
        ("stop", ("",)),
        ("stop_token_ids", (-1,)),
        ("repetition_penalty", 0.0),
        ("logprobs", 21),
    ],
)
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_boundary_values_are_accepted():
    assert SamplingParams(top_p=1.0, temperature=0.0, max_tokens=1).greedy
    assert SamplingParams(temperature=1e-5).greedy
    assert not SamplingParams(temperature=0.5).greedy
    assert SamplingParams(stop="x").stop == ("x",)


async def collect(engine: AsyncEngine, params: SamplingParams, prompt=PROMPT) -> list[int]:
    return [t async for out in engine.generate(prompt, params) for t in out.token_ids]


async def test_prompt_and_context_errors(model_dir):
    async with AsyncEngine(EngineConfig(model=model_dir)) as engine:
        for prompt in ("", []):
            with pytest.raises(ValueError, match="prompt is empty"):
                await engine.generate(prompt).__anext__()
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await engine.generate([1, 9999]).__anext__()
        with pytest.raises(ValueError, match="max_tokens"):
            await engine.generate("Once", SamplingParams(max_tokens=10**9)).__anext__()
        with pytest.raises(ValueError, match="max_tokens"):
            await engine.generate(PROMPT, SamplingParams(max_tokens=508)).__anext__()
        assert len(await collect(engine, SamplingParams(max_tokens=507, ignore_eos=True))) == 507
        assert engine.is_running


async def test_extreme_values_act_greedy_next_to_a_normal_request(model_dir, solo_greedy):
    greedy = solo_greedy(PROMPT, 12)
    base = dict(max_tokens=12, ignore_eos=True)
    extremes = [
        SamplingParams(temperature=1e-5, **base),
        SamplingParams(temperature=0.0, **base),
        SamplingParams(temperature=1.0, top_p=1e-9, seed=1, **base),
        SamplingParams(temperature=1.0, top_k=1, seed=2, **base),
    ]
    async with AsyncEngine(EngineConfig(model=model_dir)) as engine:
        normal = SamplingParams(temperature=0.0, **base)
        for params in extremes:
            got, neighbour = await asyncio.gather(
                collect(engine, params), collect(engine, normal, [1, 300, 301])
            )
            assert got == greedy
            assert neighbour == solo_greedy([1, 300, 301], 12)


async def test_seeded_sampling_is_independent_of_the_batch(model_dir):
    seeded = SamplingParams(
        temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=30, ignore_eos=True
    )
    async with AsyncEngine(EngineConfig(model=model_dir)) as engine:
        alone = await collect(engine, seeded)
        others = [
            SamplingParams(temperature=1.0, seed=s, max_tokens=25, ignore_eos=True) for s in (1, 2)
        ] + [SamplingParams(temperature=0.7, max_tokens=40)]
        crowded = await asyncio.gather(
            collect(engine, seeded),
            *(collect(engine, p, [1, 50 + i]) for i, p in enumerate(others)),
        )
        again = await collect(engine, seeded)
        different_seed = await collect(
            engine,
            SamplingParams(
                temperature=0.9, top_p=0.95, top_k=50, seed=99, max_tokens=30, ignore_eos=True
            ),
        )
    assert alone == crowded[0] == again
    assert different_seed != alone


async def test_repetition_penalty_matches_transformers(model_dir, hf_model):
    import torch

    with torch.inference_mode():
        expected = hf_model.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=20,
            do_sample=False,
            repetition_penalty=1.3,
            eos_token_id=None,
        )[0, 5:].tolist()
    async with AsyncEngine(EngineConfig(model=model_dir)) as engine:
        got = await collect(
            engine,
            SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.3),
        )
    assert got == expected


async def test_logprobs_are_log_probabilities_of_the_chosen_tokens(model_dir):
    async with AsyncEngine(EngineConfig(model=model_dir)) as engine:
        outs = [
            o
            async for o in engine.generate(
                PROMPT, SamplingParams(temperature=0, max_tokens=5, logprobs=3)
            )
        ]
    for out in outs:
        (entry,) = out.logprobs
        assert entry.token_id == out.token_ids[0]
        assert entry.logprob <= 0 and len(entry.top) == 3
        assert entry.top[0][0] == entry.token_id  # greedy picks the top token
        assert math.isclose(entry.top[0][1], entry.logprob, rel_tol=1e-6)
