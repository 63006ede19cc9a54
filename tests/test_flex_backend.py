"""FlexBackend: exact against ReferenceBackend on the CPU (unfused flex_attention),
block lists that only skip work, refusals, the factory; compiled and CUDA-graph
paths on CUDA (marked gpu)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask
from torch.testing import assert_close

from aioserve.runners.attention.flex import masks as flex_masks
from aioserve.runners.attention.flex.backend import FlexBackend
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.reference import ReferenceBackend
from aioserve.runners.attention.registry import backend_for
from tests.flex_support import (
    both_attend,
    load,
    model_step,
    random_cache,
    random_tables,
    rules_of,
    tiny_llama,
)

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
BS, BLOCKS = 4, 48
TIGHT = {"rtol": 1e-5, "atol": 2e-6}

STEPS = {  # name: (start positions, new tokens per sequence)
    "decode": ([0, 3, 4, 7, 15, 21], [1, 1, 1, 1, 1, 1]),
    "prefill": ([0, 0, 8], [5, 9, 7]),
    "mixed": ([5, 0, 9, 3, 12, 0], [1, 7, 1, 6, 1, 1]),
}
RULES = {
    "gqa": rules_of(),
    "mha": rules_of(q_heads=2, kv_heads=2),
    "window": rules_of(window=5),
    "softcap_window": rules_of(window=3, softcap=2.0, scaling=0.3),
}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("step", STEPS)
def test_flex_equals_reference(step, rule):
    starts, counts = STEPS[step]
    rules = RULES[rule]
    cache = random_cache(BLOCKS, BS, rules.kv_heads, rules.k_dim)
    tables = random_tables([s + c for s, c in zip(starts, counts)], BS, BLOCKS)
    reference, flex = both_attend(cache, starts, counts, tables, BS, rules)
    assert_close(flex, reference, **TIGHT)


def test_query_tiles_and_shared_prefix(monkeypatch):
    """Prompts over several query tiles (tile of 4 here), sequences sharing blocks."""
    monkeypatch.setattr(flex_masks, "Q_BLOCK", 4)
    starts, counts = [0, 8, 11], [11, 6, 1]
    tables = random_tables([11, 14, 12], BS, BLOCKS, shared_prefix=2)
    for rules in (rules_of(window=6), rules_of(softcap=1.5)):
        cache = random_cache(BLOCKS, BS, 2, 8, seed=3)
        reference, flex = both_attend(cache, starts, counts, tables, BS, rules)
        assert_close(flex, reference, **TIGHT)


def listed(indices, counts, total_blocks):
    """Dense ``[b, tiles, total_blocks]`` bool of a block list."""
    b, _, tiles, _ = indices.shape
    dense = torch.zeros(b, tiles, total_blocks, dtype=torch.bool)
    for i in range(b):
        for t in range(tiles):
            dense[i, t, indices[i, 0, t, : counts[i, 0, t]].long()] = True
    return dense


@pytest.mark.parametrize("window", [None, 3, 6])
def test_block_lists_only_skip_work(monkeypatch, window):
    """The fused kernel calls the mask only on partial blocks and skips unlisted ones:
    every slot the mask allows is in a listed block, full blocks are wholly visible to
    every real query of their tile, and no block is listed twice."""
    monkeypatch.setattr(flex_masks, "Q_BLOCK", 4)
    starts, counts = [0, 8, 11, 4], [11, 6, 1, 1]
    tables = random_tables([11, 14, 12, 5], BS, BLOCKS, shared_prefix=1)
    cache = random_cache(BLOCKS, BS, 2, 8)
    meta, _ = FlexBackend(torch.device("cpu")).build_metadata(
        [cache], starts, counts, tables, BS, torch.device("cpu"), (3, 6))
    checked = 0
    for group in meta.flex_groups:
        real = [c for c in counts if (c == 1) == (group.q_len == 1)]  # the group's rows
        mask = group.masks[window]
        b, q_len, kv_len = group.size, group.q_len, BLOCKS * BS
        visible = create_mask(mask.mask_mod, b, 1, q_len, kv_len, device="cpu")[:, 0]
        visible = visible.view(b, q_len, BLOCKS, BS)
        partial = listed(mask.kv_indices, mask.kv_num_blocks, BLOCKS)
        full = listed(mask.full_kv_indices, mask.full_kv_num_blocks, BLOCKS)
        assert not (partial & full).any()
        assert not visible[:, max(real):].any()  # padding queries see nothing
        for row, count in enumerate(real):
            for q in range(count):
                tile = q // flex_masks.Q_BLOCK
                seen = visible[row, q].any(-1)
                assert seen.any()
                assert not (seen & ~(partial[row, tile] | full[row, tile])).any()
                assert visible[row, q][full[row, tile]].all()
                checked += 1
    assert checked == sum(counts)


def test_graph_safe_decode_metadata_equals_reference():
    """decode_metadata from static buffers (stale columns, padding rows on a scratch
    block) attends like the reference for the real rows."""
    rules = rules_of(window=5)
    lens = [1, 4, 5, 9, 22]
    tables = random_tables(lens, BS, BLOCKS)
    cache = random_cache(BLOCKS, BS, 2, 8)
    width, rows = 8, 8
    block_table = torch.full((rows, width), 7, dtype=torch.int32)  # stale entries
    block_table[len(lens):] = 0  # padding rows: scratch block 0
    for i, table in enumerate(tables):
        block_table[i, : len(table)] = torch.tensor(table)
    seq_lens = torch.tensor(lens + [1] * (rows - len(lens)), dtype=torch.int32)
    slots = torch.zeros(rows, dtype=torch.int64)
    q = torch.randn(rows, 4, 8, generator=torch.Generator().manual_seed(2))
    flex = FlexBackend(torch.device("cpu"))
    meta = flex.decode_metadata([cache], slots, block_table, seq_lens, BS, (5,))
    out = flex.attend(q, *cache, meta, rules, None)[: len(lens)]
    reference = ReferenceBackend()
    ref_meta, _ = reference.build_metadata([cache], [n - 1 for n in lens], [1] * len(lens),
                                           tables, BS, torch.device("cpu"), (5,))
    assert_close(out, reference.attend(q[: len(lens)], *cache, ref_meta, rules, None), **TIGHT)


def test_model_steps_equal_reference(model_dir):
    """stories260K (GQA 8/4, head width 8) through both backends: prefill, then
    decode mixed with a new prompt; every row's logits agree."""
    steps = [
        ([[1, 403, 407, 261, 378], [1, 300, 301]], [0, 0], [5, 3]),
        ([[290], [302], [1, 261, 378, 300]], [5, 3, 0], [6, 4, 4]),
    ]
    logits = []
    for backend in (ReferenceBackend(), FlexBackend(torch.device("cpu"))):
        model, caches = load(model_dir, backend, "cpu", 16, BS)
        tables = random_tables([8, 8, 4], BS, 16)
        logits.append([
            model_step(model, backend, caches, ids, starts, tables[: len(ids)], BS)
            for ids, starts, _ in steps
        ])
    for reference, flex in zip(*logits):  # logits of magnitude ~10 after five fp32 layers
        assert_close(flex, reference, rtol=1e-5, atol=1e-4)
        assert torch.equal(flex.argmax(-1), reference.argmax(-1))


def test_refusals_and_errors():
    cpu, cuda = FlexBackend(torch.device("cpu")), FlexBackend(torch.device("cuda"))
    assert cpu.unsupported(rules_of()) is None
    assert "sinks" in cpu.unsupported(LayerRules(4, 2, 8, 8, None, None, None, True))
    assert "differs" in cpu.unsupported(LayerRules(4, 2, 16, 8, None, None, None, False))
    assert "evenly" in cpu.unsupported(rules_of(q_heads=3, kv_heads=2))
    assert "< 16" in cuda.unsupported(rules_of(dim=8))
    assert cuda.unsupported(rules_of(dim=64)) is None
    cache = random_cache(8, BS, 2, 8)
    with pytest.raises(ValueError, match="two different positions"):
        cpu.build_metadata([cache], [3, 7], [1, 1], [[1], [2, 1]], BS, torch.device("cpu"), ())
    for size in (8, 24):
        with pytest.raises(ValueError, match="power-of-two block_size >= 16"):
            flex_masks.check_block_size(size, torch.device("cuda"))
    flex_masks.check_block_size(16, torch.device("cuda"))
    ref_meta, _ = ReferenceBackend().build_metadata([cache], [0], [1], [[1]], BS,
                                                    torch.device("cpu"), ())
    with pytest.raises(TypeError):
        cpu.attend(torch.zeros(1, 4, 8), *cache, ref_meta, rules_of(), None)


def test_backend_for():
    assert isinstance(backend_for("reference", torch.device("cpu")), ReferenceBackend)
    assert isinstance(backend_for("flex", torch.device("cpu")), FlexBackend)
    with pytest.raises(ValueError, match="'reference', 'flex'|reference, flex"):
        backend_for("flash", torch.device("cpu"))
    with pytest.raises(ValueError, match="flex.*meta"):
        backend_for("flex", torch.device("meta"))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("rule", ["gqa", "window", "softcap_window"])
@pytest.mark.parametrize("step", STEPS)
def test_cuda_compiled_flex_equals_reference(step, rule):
    starts, counts = STEPS[step]
    base = RULES[rule]
    rules = rules_of(q_heads=8, kv_heads=2, dim=64, window=base.window, softcap=base.softcap,
                     scaling=base.scaling)
    cache = random_cache(64, 16, 2, 64, device="cuda")
    tables = random_tables([s + c for s, c in zip(starts, counts)], 16, 64)
    reference, flex = both_attend(cache, starts, counts, tables, 16, rules, device="cuda")
    assert_close(flex, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_replay_equals_eager(tmp_path):
    """Decode graphs of a tiny llama (head width 32, block 16): replay equals the same
    forward run eagerly, and the reference backend, for batches 1, 3 and 17."""
    from aioserve.runners.gpu.cuda_graphs import DecodeGraphs, model_decode_forward

    path, device, bs, blocks = tiny_llama(tmp_path), torch.device("cuda"), 16, 256
    flex = FlexBackend(device)
    model, caches = load(path, flex, "cuda", blocks, bs)
    reference_model, _ = load(path, ReferenceBackend(), "cuda", 1, bs)
    for k, v in caches:
        k.normal_()
        v.normal_()
    graphs = DecodeGraphs(max_batch=24, width=8, block_size=bs, scratch_block=0, device=device)
    for name in ("input_ids", "positions", "slot_mapping", "block_table", "seq_lens"):
        assert getattr(graphs.host, name).is_pinned()
    forward = model_decode_forward(model, flex, caches, bs, ())
    graphs.capture(forward)
    for batch in (1, 3, 17):
        lens = [(37 * i + 5) % 120 + 1 for i in range(batch)]
        tables = random_tables(lens, bs, blocks, seed=batch)
        ids, positions = [(11 * i + 3) % 256 for i in range(batch)], [n - 1 for n in lens]
        plan = graphs.stage(ids, positions, tables)
        replayed = graphs.replay(plan).clone()
        with torch.inference_mode():
            eager = forward(graphs.static.narrow(plan.bucket))[:batch]
        assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
        reference = model_step(reference_model, ReferenceBackend(), caches, [[i] for i in ids],
                               positions, tables, bs, device="cuda")
        assert_close(replayed, reference, rtol=1e-4, atol=2e-4)


async def test_engine_on_flex_equals_engine_on_reference(model_dir):
    import asyncio

    from aioserve import AsyncEngine, EngineConfig, SamplingParams

    async def run(backend: str) -> list[list[int]]:
        config = EngineConfig(model=model_dir, attention_backend=backend, num_kv_blocks=64,
                              max_num_seqs=4)
        params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
        async with AsyncEngine(config) as engine:

            async def one(prompt: list[int]) -> list[int]:
                return [t async for out in engine.generate(prompt, params) for t in out.token_ids]

            return await asyncio.gather(*(one([1, 5 + i, 9, 33 + 3 * i]) for i in range(6)))

    assert await run("flex") == await run("reference")
