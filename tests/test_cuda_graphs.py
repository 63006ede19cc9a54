"""CUDA-graph decode: bucket sizes, padding plan and host staging on the CPU; the
graph-safe forward over staged buffers on the CPU; capture and replay on CUDA."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from aioserve.runners.attention.flex.backend import FlexBackend
from aioserve.runners.attention.reference import ReferenceBackend
from aioserve.runners.gpu.cuda_graphs import (
    DecodeGraphs,
    DecodeInputs,
    PaddingPlan,
    bucket_for,
    capture_sizes,
    model_decode_forward,
    padding_plan,
    stage_rows,
)
from tests.flex_support import load, model_step, random_cache, random_tables

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CPU = torch.device("cpu")


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    with pytest.raises(ValueError):
        capture_sizes(0)


def test_bucket_choice_and_plan():
    sizes = capture_sizes(64)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 9, 16, 17, 63, 64)] == \
        [1, 2, 4, 8, 16, 16, 24, 64, 64]
    assert bucket_for(65, sizes) is None
    assert padding_plan(0, sizes) is None
    assert padding_plan(65, sizes) is None
    plan = padding_plan(17, sizes)
    assert plan == PaddingPlan(17, 24) and list(plan.pad_rows) == list(range(17, 24))


def test_stage_rows_fills_rows_and_padding():
    host = DecodeInputs.allocate(8, 4, CPU)
    stage_rows(host, PaddingPlan(3, 4), [5, 6, 7], [0, 4, 9], [[3], [2, 5], [1, 6, 4]], 4, 9)
    assert host.input_ids.tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    assert host.positions.tolist()[:4] == [0, 4, 9, 0]
    assert host.slot_mapping.tolist()[:4] == [12, 20, 17, 36]  # padding: slot 0 of block 9
    assert host.seq_lens.tolist()[:4] == [1, 5, 10, 1]
    assert host.block_table[:4, :3].tolist() == [[3, 0, 0], [2, 5, 0], [1, 6, 4], [9, 9, 9]]
    assert host.block_table[4:].eq(0).all()  # past the bucket: untouched
    with pytest.raises(ValueError, match="exceeds"):
        stage_rows(host, PaddingPlan(1, 1), [1], [0], [[1, 2, 3, 4, 5]], 4, 9)
    with pytest.raises(ValueError, match="does not reach"):
        stage_rows(host, PaddingPlan(1, 1), [1], [8], [[1, 2]], 4, 9)


def test_buffers_on_cpu():
    graphs = DecodeGraphs(max_batch=8, width=4, block_size=4, scratch_block=0, device=CPU)
    assert graphs.static.block_table.dtype == torch.int32
    assert graphs.static.seq_lens.eq(1).all()  # every row valid padding before any step
    assert graphs.static.narrow(3).input_ids.data_ptr() == graphs.static.input_ids.data_ptr()
    plan = graphs.stage([5, 6, 7], [0, 4, 9], [[3], [2, 5], [1, 6, 4]])
    assert plan == PaddingPlan(3, 4)
    for name in ("input_ids", "positions", "slot_mapping", "block_table", "seq_lens"):
        assert torch.equal(getattr(graphs.static, name)[:4], getattr(graphs.host, name)[:4])
    assert graphs.stage(list(range(9)), [0] * 9, [[1]] * 9) is None
    with pytest.raises(RuntimeError, match="CUDA"):
        graphs.capture(lambda inputs: inputs.input_ids.float())


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_graph_safe_forward_equals_reference(model_dir):
    """The forward a graph would capture, run eagerly over staged buffers (3 rows in a
    bucket of 4), gives the reference backend's decode logits."""
    flex = FlexBackend(CPU)
    model, caches = load(model_dir, flex, "cpu", 32, 4)
    for (k, v), seed in zip(caches, range(100)):
        fresh_k, fresh_v = random_cache(32, 4, k.shape[1], k.shape[2], seed=seed)
        k.copy_(fresh_k)
        v.copy_(fresh_v)
    lens = [1, 6, 13]
    tables = random_tables(lens, 4, 32)
    ids, positions = [403, 300, 261], [n - 1 for n in lens]
    graphs = DecodeGraphs(max_batch=8, width=6, block_size=4, scratch_block=0, device=CPU)
    plan = graphs.stage(ids, positions, tables)
    with torch.inference_mode():
        flex_logits = model_decode_forward(model, flex, caches, 4, ())(
            graphs.static.narrow(plan.bucket))[: plan.batch].clone()
    reference_model, _ = load(model_dir, ReferenceBackend(), "cpu", 32, 4)
    reference = model_step(reference_model, ReferenceBackend(), caches, [[i] for i in ids],
                           positions, tables, 4)
    assert_close(flex_logits, reference, rtol=1e-5, atol=1e-4)
    assert torch.equal(flex_logits.argmax(-1), reference.argmax(-1))


@pytest.mark.gpu
@needs_cuda
def test_cuda_capture_replays_fresh_inputs():
    """A graph of a plain function of the inputs: each replay sees the staged rows."""
    device = torch.device("cuda")
    graphs = DecodeGraphs(max_batch=24, width=4, block_size=16, scratch_block=0, device=device)
    for name in ("input_ids", "positions", "slot_mapping", "block_table", "seq_lens"):
        assert getattr(graphs.host, name).is_pinned()
    weights = torch.tensor([1.0, 10.0, 100.0], device=device)

    def forward(inputs):
        features = torch.stack([inputs.input_ids.float(), inputs.seq_lens.float(),
                                inputs.block_table[:, 0].float()], dim=1)
        return features * weights

    graphs.capture(forward)
    for batch in (1, 3, 17, 3):
        ids = [7 * i + batch for i in range(batch)]
        positions = [i % 30 for i in range(batch)]
        tables = [[i + 1, i + 2] for i in range(batch)]
        plan = graphs.stage(ids, positions, tables)
        got = graphs.replay(plan).cpu()
        want = torch.tensor([[i, p + 1, t[0]] for i, p, t in zip(ids, positions, tables)],
                            dtype=torch.float32) * weights.cpu()
        assert got.shape == (batch, 3)
        assert torch.equal(got, want)
