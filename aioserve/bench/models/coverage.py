"""Architecture coverage: the engine's greedy tokens against ``generate()`` on each tiny model."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.bench.models import tiny_models
from aioserve.errors import UnsupportedModelError


@dataclass(frozen=True)
class Verdict:
    """One architecture's result: ``status`` is ``"exact"``, ``"refused"`` or ``"WRONG"``."""

    model_type: str
    status: str
    detail: str
    references: list[list[int]]


def prompts(count: int = 8, longest: int = 90, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of 1 to ``longest`` tokens (BOS first), both ends included."""
    rng = random.Random(seed)
    lengths = [1, longest] + [rng.randint(2, longest) for _ in range(count - 2)]
    return [[1] + [rng.randint(3, 511) for _ in range(n - 1)] for n in lengths]


def save(model_type: str, directory: Path, tokenizer_dir: str, seed: int = 0) -> object:
    from transformers import AutoTokenizer

    model = tiny_models.build(model_type, seed)
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(directory)
    return model


async def serve(
    model_dir: Path, prompt_ids: list[list[int]], max_tokens: int, *, max_num_seqs: int = 4,
    max_num_batched_tokens: int = 256, block_size: int = 8, dtype: str = "float32",
) -> list[list[int]]:
    """Greedy continuations from the engine, some requests joining a decoding batch."""
    config = EngineConfig(
        model=str(model_dir), scheduler="fcfs", max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
        dtype=dtype, device="cpu",
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    async with AsyncEngine(config) as engine:
        # token ids in and out: random models' ids need not decode (and with the
        # stories tokenizer the incremental detokenizer can stall on them)
        engine.tokenizer = None
        tasks = []
        for i, prompt in enumerate(prompt_ids):
            first = asyncio.Event()
            tasks.append(asyncio.create_task(_collect(engine, prompt, params, first)))
            if i % 3 == 2:  # until its first token (or its failure)
                waiter = asyncio.create_task(first.wait())
                await asyncio.wait([waiter, tasks[-1]], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
        return list(await asyncio.gather(*tasks))


async def _collect(
    engine: AsyncEngine, prompt: list[int], params: SamplingParams, first: asyncio.Event
) -> list[int]:
    ids: list[int] = []
    async for out in engine.generate(prompt, params):
        ids += out.token_ids
        first.set()
    return ids


def check(
    model_type: str, directory: Path, tokenizer_dir: str, prompt_ids: list[list[int]],
    max_tokens: int = 16, **engine_settings: Any,
) -> Verdict:
    model = save(model_type, directory, tokenizer_dir)
    references = [tiny_models.greedy(model, p, max_tokens) for p in prompt_ids]  # type: ignore[arg-type]
    try:
        got = asyncio.run(serve(directory, prompt_ids, max_tokens, **engine_settings))
    except UnsupportedModelError as exc:
        return Verdict(model_type, "refused", str(exc), [])
    for prompt, want, have in zip(prompt_ids, references, got):
        if want != have:
            detail = f"prompt of {len(prompt)} tokens: want {want[:6]}.. got {have[:6]}.."
            return Verdict(model_type, "WRONG", detail, references)
    return Verdict(model_type, "exact", "", references)
