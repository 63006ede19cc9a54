"""The compiled panel product gives oneDNN's bits, row by row, in any batch.

Packed linears on the CPU (big float32 models) go through panels of 16 output columns
where the panel product reproduces oneDNN's sums on the weight itself; the engine's
tokens must then be the same as on oneDNN alone, and a row's numbers the same in any
batch (the premise of batch invariance).
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from isa_support import LEVELS, onednn_level

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.bench.models.random_model import ensure_random_model
from aioserve.runners.cpu import packed_linear, panel_linear
from aioserve.runners.cpu.panel_linear import PanelWeight
from aioserve.runners.torch.runner import TorchRunner

#: oneDNN's float32 AVX2 kernels add as the panels do (measured); its AVX-512 kernels
#: (and their sums' order) are others, and packing may rightly keep oneDNN there
AVX2_ONEDNN = onednn_level() == "avx2"
#: below AVX2 (ONEDNN_MAX_CPU_ISA=AVX or SSE41) oneDNN's rows depend on the row count:
#: batch invariance of packed models is promised from AVX2 up only
needs_onednn_avx2 = pytest.mark.skipif(
    LEVELS.index(onednn_level()) < LEVELS.index("avx2"),
    reason="oneDNN runs below AVX2 here: a row's bits depend on the row count")

needs_panels = pytest.mark.skipif(
    not (panel_linear.available()
         and packed_linear.available(torch.device("cpu"), torch.float32, 10**9)),
    reason="no compiled panel product (AVX2 + FMA) or no oneDNN in this torch",
)


def reordered(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` in oneDNN's blocked layout (what packing falls back to)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, packed_linear.EXPECTED_ROWS)


def onednn(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    return packed_linear.linear_pointwise(rows, reordered(weight), bias)


# (outputs, inputs, bias): K up to 1,024 is one chain in oneDNN, past it blocks of sums;
# outputs not a multiple of 16 leave a ragged last panel
SHAPES = [(3072, 576, False), (576, 1536, False), (100, 3072, False), (40, 7, False),
          (172, 64, True), (33, 1100, True), (5, 300, False)]


@needs_panels
@pytest.mark.parametrize(("out_features", "in_features", "with_bias"), SHAPES)
def test_panels_give_onednn_bits(out_features, in_features, with_bias):
    torch.manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features)
    bias = torch.randn(out_features) if with_bias else None
    packed = packed_linear.pack_weight(weight, bias)
    if AVX2_ONEDNN:
        assert isinstance(packed, PanelWeight)
        assert packed.k_block == min(in_features, 1024)
    rows = torch.randn(45, in_features) * 3  # panels or oneDNN: oneDNN's bits
    got = packed_linear.linear_pointwise(rows, packed, bias)
    assert got.shape == (45, out_features)
    assert torch.equal(got, onednn(rows, weight, bias))
    torch.testing.assert_close(got, torch.nn.functional.linear(rows, weight, bias),
                               rtol=1e-4, atol=1e-3)


@needs_panels
def test_a_row_has_the_same_bits_in_any_batch():
    torch.manual_seed(3)
    weight = torch.randn(200, 1536)
    packed = PanelWeight(panel_linear.to_panels(weight), 200, 1024)
    rows = torch.randn(250, 1536)
    full = packed_linear.linear_pointwise(rows, packed)
    # tile splits (6 + 6 + 5 ...), the row chunk edge at 96, one row alone
    for count in (1, 2, 5, 7, 13, 31, 32, 33, 96, 97, 191):
        assert torch.equal(packed_linear.linear_pointwise(rows[:count], packed), full[:count])
    assert torch.equal(packed_linear.linear_pointwise(rows[249:], packed), full[249:])
    strided = rows[::2]  # not contiguous: copied, same numbers
    assert torch.equal(packed_linear.linear_pointwise(strided, packed), full[::2])
    assert packed_linear.linear_pointwise(rows[:0], packed).shape == (0, 200)
    threads = torch.get_num_threads()
    try:  # panels shared out over one thread instead of several
        torch.set_num_threads(1)
        assert torch.equal(packed_linear.linear_pointwise(rows, packed), full)
    finally:
        torch.set_num_threads(threads)


def test_panels_of_a_strided_weight_are_its_columns():
    weight = torch.randn(96, 32).t()  # [32 outputs, 96 inputs], not contiguous
    panels = panel_linear.to_panels(weight)
    assert panels.shape == (2, 96, 16)
    assert torch.equal(panels, panel_linear.to_panels(weight.contiguous()))
    assert torch.equal(panels[1, :, 3], weight[19])


@needs_panels
def test_a_weight_whose_sums_differ_stays_on_onednn():
    torch.manual_seed(4)
    weight, other = torch.randn(64, 96), torch.randn(64, 96)
    def reference(rows):
        return onednn(rows, other)

    assert panel_linear.pack(weight, reference) is None
    assert panel_linear.pack(weight.double(), reference) is None
    assert panel_linear.pack(torch.zeros(64, 0), reference) is None  # nothing to pack


@needs_panels
def test_bad_shapes_raise_naming_the_argument():
    packed = panel_linear.pack(torch.randn(32, 16), lambda rows: onednn(rows, torch.zeros(32, 16)))
    assert packed is None  # zeros' product is not this weight's
    weight = panel_linear.PanelWeight(panel_linear.to_panels(torch.randn(32, 16)), 32, 16)
    with pytest.raises(RuntimeError, match="panels"):
        panel_linear.linear(torch.randn(3, 17), weight)
    with pytest.raises(RuntimeError, match="rows"):
        panel_linear.linear(torch.randn(3, 16).double(), weight)
    with pytest.raises(RuntimeError, match="k_block"):
        panel_linear.linear(torch.randn(3, 16), weight._replace(k_block=0))
    empty = panel_linear.PanelWeight(torch.zeros(2, 0, 16), 20, 1)
    assert torch.equal(panel_linear.linear(torch.zeros(3, 0), empty), torch.zeros(3, 20))
    with pytest.raises(RuntimeError, match="out"):
        panel_linear.linear(torch.randn(3, 16), weight._replace(out_features=50))


def test_without_the_kernel_packing_is_onednn(monkeypatch):
    if not packed_linear.available(torch.device("cpu"), torch.float32, 10**9):
        pytest.skip("no oneDNN in this torch")
    monkeypatch.setattr(panel_linear, "available", lambda: False)
    packed = packed_linear.pack_weight(torch.randn(48, 32))
    assert isinstance(packed, torch.Tensor)
    rows = torch.randn(3, 32)
    assert packed_linear.linear_pointwise(rows, packed).shape == (3, 48)


LLAMA = {  # down_proj's 1,100 inputs: oneDNN's blocked sums
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 1100, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 700,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2,
}


async def greedy_tokens(model: str, prompts: list[list[int]], together: bool) -> list:
    config = EngineConfig(model=model, max_num_seqs=4, forward="lean-llama")
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    async def one(engine: AsyncEngine, prompt: list[int]) -> list[int]:
        return [t async for out in engine.generate(prompt, params) for t in out.token_ids]

    runner = await asyncio.to_thread(TorchRunner, config)  # no tokenizer in the model
    try:
        async with AsyncEngine(config, runner=runner) as engine:
            kinds = {type(w) for layer in runner.lean.layers for w in layer[4]}
            if together:
                return [kinds, await asyncio.gather(*(one(engine, p) for p in prompts))]
            return [kinds, [await one(engine, p) for p in prompts]]
    finally:
        runner.close()


@needs_panels
@needs_onednn_avx2
async def test_engine_tokens_are_onednn_tokens_in_any_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(packed_linear, "MIN_PARAMETERS", 0)
    spec = tmp_path / "llama-1100.json"
    spec.write_text(json.dumps(LLAMA))
    model = str(ensure_random_model(str(spec), cache_dir=tmp_path / "models"))
    prompts = [[1, *range(3 + i, 40 + 7 * i)] for i in range(4)]
    kinds, batched = await greedy_tokens(model, prompts, together=True)
    assert kinds == {PanelWeight} or not AVX2_ONEDNN
    _, alone = await greedy_tokens(model, prompts, together=False)
    assert batched == alone
    monkeypatch.setattr(panel_linear, "available", lambda: False)
    kinds, stock = await greedy_tokens(model, prompts, together=True)
    assert kinds == {torch.Tensor}
    assert stock == batched
