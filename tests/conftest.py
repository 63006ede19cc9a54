"""Shared fixtures: the real test model, loaded once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = os.environ.get(
    "AIOSERVE_TEST_MODEL", str(REPO.parent / "shared" / "models" / "stories260K-hf")
)


@pytest.fixture(scope="session", autouse=True)
def native_kernels_built() -> None:
    """Build the compiled CPU kernels once, first, in this process (or wait for another
    process's build): every engine of the suite then loads them at once, as servers do
    once their environment's build is done (a build takes 15-60 s on a 2-core machine)."""
    from aioserve.runners.cpu import native_kernels

    native_kernels.build_now()


@pytest.fixture(scope="session")
def model_dir() -> str:
    if not Path(MODEL_DIR, "config.json").exists():
        pytest.fail(f"test model not found at {MODEL_DIR} (set AIOSERVE_TEST_MODEL)")
    return MODEL_DIR


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="session")
def solo_greedy(hf_model):
    """transformers generate() run alone: prompt ids -> greedy continuation ids."""
    import torch

    cache: dict[tuple[tuple[int, ...], int, bool], list[int]] = {}

    def run(prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = True) -> list[int]:
        key = (tuple(prompt_ids), max_new_tokens, ignore_eos)
        if key not in cache:
            extra = {"eos_token_id": None} if ignore_eos else {}
            with torch.inference_mode():
                out = hf_model.generate(
                    torch.tensor([prompt_ids]),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    **extra,
                )
            cache[key] = out[0, len(prompt_ids) :].tolist()
        return cache[key]

    return run
