"""Every architecture's attention rules are carried: tiny random decoders served
exactly (greedy, token for token vs generate() alone) under staggered batching."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.masking_utils import sliding_window_overlay

from aioserve.bench.models import coverage, tiny_models
from aioserve.runners.attention.paged_metadata import window_mask

ARCHITECTURES = [
    "mistral", "gemma2", "gemma3_text", "gpt_oss", "deepseek_v3", "stablelm", "falcon",
    "qwen3", "gpt2",
]

#: 6 prompts of 1-48 tokens: most are longer than the 16-token window.
PROMPTS = coverage.prompts(count=6, longest=48, seed=3)


def assert_lively(references: list[list[int]]) -> None:
    """The test is not dead: the model does not repeat one token everywhere."""
    assert len({t for ref in references for t in ref}) > 4, references


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_served_exactly_under_staggered_batching(model_type, model_dir, tmp_path):
    verdict = coverage.check(model_type, tmp_path, model_dir, PROMPTS, max_tokens=8)
    assert verdict.status == "exact", verdict.detail
    assert_lively(verdict.references)


@pytest.mark.parametrize("model_type", ["mistral", "gemma2"])
def test_chunked_prefill_across_the_window(model_type, model_dir, tmp_path):
    """Prompts prefilled in chunks of at most 12 tokens, so chunks attend keys of
    earlier chunks across the 16-token window's edge."""
    prompts = coverage.prompts(count=3, longest=40, seed=5)
    verdict = coverage.check(
        model_type, tmp_path, model_dir, prompts, max_tokens=6,
        max_num_seqs=2, max_num_batched_tokens=12,
    )
    assert verdict.status == "exact", verdict.detail
    assert_lively(verdict.references)


@pytest.mark.parametrize("model_type", ["bloom", "mpt"])
def test_alibi_models_are_refused_at_load(model_type, model_dir, tmp_path):
    verdict = coverage.check(model_type, tmp_path, model_dir, PROMPTS[:1], max_tokens=2)
    assert verdict.status == "refused"
    assert model_type in verdict.detail and "ALiBi" in verdict.detail


def test_window_mask_follows_transformers_convention():
    window, width = 4, 12
    positions = np.array([[0, 3, 4, 9, 11]])
    got = window_mask(positions, width, window)[0, 0] == 0
    inner = sliding_window_overlay(window)
    want = [
        [bool(inner(0, 0, torch.tensor(p), torch.tensor(k))) and k <= p for k in range(width)]
        for p in positions[0]
    ]
    assert got.tolist() == want


def test_tiny_models_cover_thirty_architectures():
    assert len(tiny_models.ARCHITECTURES) == 30


def load_runner(model_type: str, directory, model_dir):
    from aioserve import EngineConfig
    from aioserve.runners.torch.runner import TorchRunner

    coverage.save(model_type, directory, model_dir)
    config = EngineConfig(model=str(directory), num_kv_blocks=8, block_size=8, device="cpu",
                          dtype="float32")
    return TorchRunner(config)


def test_layer_rules_shape_the_cache(model_dir, tmp_path):
    mla = load_runner("deepseek_v3", tmp_path / "mla", model_dir)
    assert [tuple(k.shape[1:]) + tuple(v.shape[1:]) for k, v in mla.kv_caches] == [
        (4, 24, 4, 8), (4, 24, 4, 8)  # K: nope 16 + rope 8; V: 8
    ]
    mixed = load_runner("gpt_oss", tmp_path / "sinks", model_dir)
    windows = [mixed.layer_rules[i].window for i in range(2)]
    assert windows == [tiny_models.WINDOW, None] and mixed.windows == (tiny_models.WINDOW,)
    assert all(rules.sinks for rules in mixed.layer_rules.values())
    for runner in (mla, mixed):
        runner.close()


def test_layers_that_bypass_the_interface_are_refused():
    from aioserve.errors import UnsupportedModelError
    from aioserve.runners.attention.layer_rules import LayerRules
    from aioserve.runners.model.adapters import check_coverage

    rules = LayerRules(4, 2, 16, 16, None, None, None, False)
    with pytest.raises(UnsupportedModelError, match=r"falcon: layers \[1\] compute attention"):
        check_coverage("falcon", 2, {0: rules})


def test_lean_forward_is_refused_for_a_model_it_does_not_reproduce(model_dir, tmp_path):
    from aioserve import EngineConfig
    from aioserve.runners.torch.runner import TorchRunner

    coverage.save("gemma2", tmp_path / "gemma2", model_dir)  # soft-capping, windows
    config = EngineConfig(model=str(tmp_path / "gemma2"), num_kv_blocks=8, block_size=8,
                          device="cpu", dtype="float32", forward="lean-llama")
    with pytest.raises(ValueError, match="forward: lean-llama needs a Llama model"):
        TorchRunner(config)
