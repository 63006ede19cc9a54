"""The attention-backend registry and the seam every forward goes through: each
forward runs on each backend with the same greedy tokens, and a backend that does not
serve a forward is refused before the model loads, by an error naming both options."""

from __future__ import annotations

import asyncio

import pytest
import torch

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.runners.attention import registry
from aioserve.runners.attention.reference import ReferenceBackend
from aioserve.runners.torch.runner import TorchRunner

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture
def transformers_only(monkeypatch):
    """A registered backend that serves only transformers' forward (removed after)."""
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    registry.register_backend("eager-only", lambda device, invariance: ReferenceBackend(),
                              forwards=("transformers",), reason="it hooks modules only")
    return "eager-only"


def test_names_and_unknown_backend():
    assert registry.backend_names()[:2] == ("reference", "flex")
    with pytest.raises(ValueError, match="attention backend: 'flash' is not one of reference"):
        registry.backend_for("flash", torch.device("cpu"))


def test_registration_is_checked(transformers_only):
    with pytest.raises(ValueError, match="already registered"):
        registry.register_backend("reference", lambda device, invariance: ReferenceBackend())
    with pytest.raises(ValueError, match="unknown forwards"):
        registry.register_backend("other", lambda device, invariance: ReferenceBackend(),
                                  forwards=("x",))
    assert transformers_only in registry.backend_names()
    assert isinstance(registry.backend_for(transformers_only, torch.device("cpu")),
                      ReferenceBackend)


def test_unserved_forward_is_refused_before_the_model_loads(transformers_only):
    config = EngineConfig(model="/nonexistent/model", forward="lean-llama",
                          attention_backend=transformers_only, device="cpu")
    with pytest.raises(ValueError) as caught:
        TorchRunner(config)  # the model path does not exist: refused before any load
    message = str(caught.value)
    assert message.startswith("--forward lean-llama cannot run with --attention-backend "
                              "eager-only: it serves --forward transformers")
    assert "it hooks modules only" in message


@pytest.mark.parametrize("backend", ["reference", "flex"])
def test_lean_forward_binds_the_backends_layer_attention(model_dir, backend):
    config = EngineConfig(model=model_dir, forward="lean-llama", attention_backend=backend,
                          device="cpu", num_kv_blocks=64, max_num_seqs=4)
    runner = TorchRunner(config)  # the load probe: lean logits equal transformers' bits
    try:
        assert runner.lean is not None
        assert type(runner.backend).__name__ == {"reference": "ReferenceBackend",
                                                  "flex": "FlexBackend"}[backend]
        assert len(runner.lean.attention) == len(runner.layer_rules)
    finally:
        runner.close()


def test_every_forward_on_every_backend_gives_the_same_greedy_tokens(model_dir):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [[1, 5 + i, 9, 33 + 3 * i][: 2 + i % 3] for i in range(5)]

    async def run(forward: str, backend: str) -> list[list[int]]:
        config = EngineConfig(model=model_dir, forward=forward, attention_backend=backend,
                              device="cpu", num_kv_blocks=64, max_num_seqs=4)
        async with AsyncEngine(config) as engine:

            async def one(prompt: list[int]) -> list[int]:
                return [t async for out in engine.generate(prompt, params) for t in out.token_ids]

            return await asyncio.gather(*(one(p) for p in prompts))

    runs = {(forward, backend): asyncio.run(run(forward, backend))
            for forward in registry.FORWARDS for backend in ("reference", "flex")}
    baseline = runs["transformers", "reference"]
    assert all(len(tokens) == 12 for tokens in baseline)
    assert all(tokens == baseline for tokens in runs.values()), runs
