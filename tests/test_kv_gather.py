"""Block gathers into reused buffers, and the CPU runner's malloc settings.

The gather buffers are shared by every layer and step, so what could go wrong is
aliasing: keys overwritten by values, a smaller gather reading a larger one's stale
rows, an attention output that is a view of a buffer the next layer overwrites.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from aioserve.runners.attention.kv_gather import GatherBuffers, gather, gather_index
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.attention.reference import ReferenceBackend

BLOCK = 4


def caches(head_major: bool, blocks: int = 12, heads: int = 2, dim: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shape = (heads, blocks * BLOCK, dim) if head_major else (blocks * BLOCK, heads, dim)
    k, v = (torch.randn(shape, generator=gen) for _ in range(2))
    return (k.transpose(0, 1), v.transpose(0, 1)) if head_major else (k, v)


def test_buffered_gather_equals_a_fresh_one_in_both_layouts_and_any_order():
    buffers = GatherBuffers()
    for head_major in (True, False):
        k_cache, v_cache = caches(head_major)
        for blocks in ([3, 1, 7, 2, 9, 0], [5], [11, 4, 4, 8, 6, 10, 1, 2]):  # grows, shrinks
            index = gather_index(k_cache, torch.tensor(blocks), BLOCK)
            keys = gather(k_cache, index, BLOCK, buffers, 0)
            values = gather(v_cache, index, BLOCK, buffers, 1)
            assert torch.equal(keys, gather(k_cache, index, BLOCK))  # values did not overwrite
            assert torch.equal(values, gather(v_cache, index, BLOCK))
            per_head = k_cache.permute(1, 0, 2).reshape(2, -1, BLOCK, 8)[:, blocks]
            assert torch.equal(keys, per_head)
    assert buffers.nbytes() > 0


def test_attention_output_outlives_the_buffers_reuse():
    """A layer's output must not be a view of the buffers the next layer rewrites."""
    backend = ReferenceBackend()
    k_cache, v_cache = caches(True, blocks=50)
    rules = LayerRules(4, 2, 8, 8, None, None, None, False)
    gen = torch.Generator().manual_seed(1)
    starts, counts = [0, 5, 9, 17, 30, 3], [7, 1, 1, 1, 1, 6]  # a prefill group and decode
    tables = np.arange(1, 49).reshape(6, 8)
    q = torch.randn(sum(counts), 4, 8, generator=gen)
    meta, _ = backend.build_metadata([(k_cache, v_cache)], starts, counts, tables, BLOCK,
                                     torch.device("cpu"), ())
    first = backend.attend(q, k_cache, v_cache, meta, rules, None)
    kept = first.clone()
    other = torch.randn(sum(counts), 4, 8, generator=gen)
    backend.attend(other, v_cache, k_cache, meta, rules, None)  # rewrites both buffers
    assert torch.equal(first, kept)
    # one decode-only group: attend_layer returns _attend's result itself (no copy)
    single, _ = backend.build_metadata([(k_cache, v_cache)], [5, 9], [1, 1], tables[:2, :3],
                                       BLOCK, torch.device("cpu"), ())
    assert len(single.groups) == 1
    alone = backend.attend(q[:2], k_cache, v_cache, single, rules, None)
    kept_alone = alone.clone()
    backend.attend(other[:2], v_cache, k_cache, single, rules, None)
    assert torch.equal(alone, kept_alone)
    fresh = ReferenceBackend()
    meta_fresh, _ = fresh.build_metadata([(k_cache, v_cache)], starts, counts, tables, BLOCK,
                                         torch.device("cpu"), ())
    assert torch.equal(first, fresh.attend(q, k_cache, v_cache, meta_fresh, rules, None))


def test_malloc_tuning_is_once_per_process_and_can_be_turned_off():
    probe = ("from aioserve.runners.cpu.malloc import tune_malloc; "
             "import platform; print(tune_malloc(), tune_malloc(), platform.libc_ver()[0])")
    on = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                        check=True).stdout.split()
    assert on[0] == on[1]  # the second call answers what the first did
    assert on[0] == str(on[2] == "glibc")
    off = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={"AIOSERVE_MALLOC_TUNING": "0", "PATH": ""})
    assert off.stdout.split()[:2] == ["False", "False"]


def test_malloc_tuning_rejects_a_bad_setting(monkeypatch):
    from aioserve.runners.cpu.malloc import tune_malloc

    monkeypatch.setenv("AIOSERVE_MALLOC_TUNING", "yes")
    tune_malloc.cache_clear()  # a refused setting is not cached: the next call asks again
    try:
        with pytest.raises(ValueError, match="AIOSERVE_MALLOC_TUNING must be 0 or 1"):
            tune_malloc()
    finally:
        tune_malloc.cache_clear()
