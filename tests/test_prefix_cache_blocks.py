"""Prefix caching in the block pool and the engine core, on the SimulatedRunner: keys,
reference counts, LRU eviction before preemption, no leaks, the policy's view."""

from __future__ import annotations

import random

import pytest

from aioserve.block_keys import block_key, extend_keys
from aioserve.engine.core import EngineCore
from aioserve.engine.prefix_cache import cached_prefix
from aioserve.kv_cache import BlockManager
from aioserve.request import Request, RequestStatus
from aioserve.sampling_params import SamplingParams
from aioserve.sim.runner import SimulatedRunner
from schedulers.fcfs import FCFSScheduler


def make_core(num_blocks: int, block_size: int = 4, caching: bool = True, **options) -> EngineCore:
    runner = SimulatedRunner(num_kv_blocks=num_blocks, block_size=block_size, step_ms=1.0)
    core = EngineCore(
        FCFSScheduler(options.pop("watermark", 0.0)),
        BlockManager(num_blocks, block_size, enable_caching=caching),
        max_num_seqs=options.get("max_num_seqs", 8),
        max_num_batched_tokens=options.get("max_num_batched_tokens", 256),
        max_model_len=512,
        eos_token_ids=(2,),
        clock=runner.clock,
    )
    core.runner = runner  # type: ignore[attr-defined]
    return core


def request(request_id: str, prompt: list[int], max_tokens: int = 4) -> Request:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return Request(request_id, list(prompt), params, 0.0)


async def step(core: EngineCore) -> int:
    """One step on the simulated runner; returns the tokens fed."""
    batch = core.schedule()
    if batch is None:
        return 0
    held = [list(r.block_ids) for r in core.running]
    core.blocks.check_integrity(held=held)
    output = await core.runner.step(batch)  # type: ignore[attr-defined]
    core.update(batch, output)
    return batch.num_tokens


async def run_all(core: EngineCore) -> int:
    fed = 0
    while core.has_work:
        fed += await step(core)
    return fed


def test_keys_chain_over_the_prefix():
    a, b = block_key(None, [1, 2]), block_key(None, [3, 4])
    assert block_key(a, [5, 6]) != block_key(b, [5, 6])  # same tokens, other prefix
    assert block_key(a, [5, 6]) == block_key(block_key(None, (1, 2)), (5, 6))
    keys = extend_keys([], 2, 2, lambda s, n: [1, 2, 5, 6, 7][s : s + n])
    assert keys == [a, block_key(a, [5, 6])]


def test_shared_blocks_are_counted_and_cached_when_released():
    pool = BlockManager(4, 2, enable_caching=True)
    table = pool.allocate(2)
    keys = extend_keys([], 2, 2, lambda s, n: [1, 2, 3, 4][s : s + n])
    for block_id, key in zip(table, keys):
        pool.cache(block_id, key)
    assert pool.match(keys) == table and pool.num_unused(table) == 0
    pool.share(table[:1])
    pool.check_integrity(held=[table, table[:1]])
    pool.free(table)
    assert pool.num_free_blocks == 3 and pool.usage == 0.25  # one still held
    pool.free(table[:1])
    pool.check_integrity(held=[])
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 2
    assert pool.num_unused(table) == 2
    # plain free blocks go first; then cached ones, a table's last block first
    assert pool.allocate(2) != table and pool.num_cached_blocks == 2
    assert pool.allocate(1) == [table[1]] and pool.match(keys) == table[:1]
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([table[0]])


def test_a_key_held_by_another_block_is_not_registered_twice():
    pool = BlockManager(2, 2, enable_caching=True)
    first, second = pool.allocate(1), pool.allocate(1)
    key = block_key(None, [1, 2])
    pool.cache(first[0], key)
    pool.cache(second[0], key)
    assert pool.match([key]) == first and pool.num_cached_blocks == 1
    pool.free(second)
    pool.check_integrity(held=[first])


def test_caching_off_registers_nothing():
    pool = BlockManager(2, 2)
    pool.cache(pool.allocate(1)[0], block_key(None, [1, 2]))
    assert pool.num_cached_blocks == 0


def test_the_last_token_is_never_cached():
    pool = BlockManager(8, 4, enable_caching=True)
    done = request("a", list(range(3, 11)))  # 8 tokens: two full blocks
    done.block_ids = pool.allocate(2)
    for block_id, key in zip(done.block_ids, extend_keys([], 2, 4, done.token_ids_from)):
        pool.cache(block_id, key)
    assert len(cached_prefix(pool, request("b", list(range(3, 11))))) == 1
    assert len(cached_prefix(pool, request("c", list(range(3, 12))))) == 2


async def test_a_second_request_skips_the_cached_prefix():
    core = make_core(32)
    prefix = list(range(3, 19))  # four blocks of 4
    core.add(request("a", prefix + [30, 31]))
    first = await run_all(core)
    core.add(request("b", prefix + [40, 41]))
    second = await run_all(core)
    assert (first, second) == (18 + 3, 18 + 3 - 16)
    assert (core.prefix_cache_queries, core.prefix_cache_hits) == (36, 16)


async def test_the_policy_sees_cached_tokens():
    core = make_core(32)
    prefix = list(range(3, 19))
    core.add(request("a", prefix + [30]))
    await run_all(core)
    waiting = request("b", prefix + [40, 41, 42])
    core.add(waiting)
    state = core.snapshot()
    assert state.cached_tokens(waiting) == 16
    assert state.tokens_to_compute(waiting) == 3
    # 5 blocks for 19 tokens: 4 cached but unused (they leave the free count), 1 new
    assert state.blocks_needed(waiting, 3) == 5
    await step(core)
    assert waiting.num_computed_tokens == 19 and waiting.num_cached_tokens == 16
    core.add(request("c", prefix + [50]))
    state = core.snapshot()
    assert state.blocks_needed(core.waiting[0], 1) == 1  # "b" holds the 4 shared blocks
    assert state.cached_tokens(waiting) == 0  # running: its blocks are its own


async def test_cached_blocks_are_evicted_before_anyone_is_preempted():
    core = make_core(24)
    for i in range(4):  # distinct prompts leave 4 x 3 cached blocks behind
        core.add(request(f"warm-{i}", [3 + i] * 12, max_tokens=1))
    await run_all(core)
    assert core.blocks.num_cached_blocks == 12 and core.blocks.usage == 0
    for i in range(4):  # 4 x 6 blocks: exactly the whole cache
        core.add(request(f"big-{i}", [100 + i] * 16, max_tokens=8))
    await run_all(core)
    assert core.num_preemptions == 0
    assert core.blocks.num_evictions >= 12
    core.blocks.check_integrity(held=[])


async def test_a_preempted_request_finds_its_blocks_again():
    core = make_core(14, max_num_seqs=3)
    for i in range(3):  # 3 x 6 blocks at the peak > 14: someone is preempted
        core.add(request(f"r{i}", [3 + i] * 12, max_tokens=12))
    recomputed = []
    core.on_finish = lambda r: recomputed.append(r.metrics.num_preemptions)
    await run_all(core)
    assert core.num_preemptions > 0 and any(recomputed)
    assert core.prefix_cache_hits > 0  # readmissions started after their cached blocks
    core.blocks.check_integrity(held=[])


@pytest.mark.parametrize("caching", [True, False])
async def test_no_leak_after_a_thousand_mixed_requests(caching):
    rng = random.Random(1)
    core = make_core(48, caching=caching, max_num_seqs=6, max_num_batched_tokens=24)
    prefixes = [[3 + g] * rng.randint(4, 20) for g in range(5)]
    added = 0
    while added < 1000 or core.has_work:
        if added < 1000 and rng.random() < 0.7:
            suffix = [rng.randint(3, 200) for _ in range(rng.randint(1, 8))]
            core.add(request(f"r{added}", rng.choice(prefixes) + suffix, rng.randint(1, 12)))
            added += 1
        if core.requests and rng.random() < 0.15:
            core.abort(rng.choice(list(core.requests)))
        batch = core.schedule()
        if batch is None:
            continue
        if core.requests and rng.random() < 0.1:  # aborted while the step runs
            core.abort(rng.choice(batch.request_ids))
        core.update(batch, await core.runner.step(batch))  # type: ignore[attr-defined]
        core.blocks.check_integrity(held=[r.block_ids for r in core.running])
    pool = core.blocks
    pool.check_integrity(held=[])
    assert pool.usage == 0 and pool.num_free_blocks == pool.num_blocks
    assert (pool.num_cached_blocks > 0) == caching
    assert (core.prefix_cache_hits > 0) == caching
    assert all(r.status is RequestStatus.FINISHED for r in core.requests.values())


async def test_the_simulated_prefill_cost_counts_only_uncached_tokens():
    fed = {}
    for caching in (True, False):
        core = make_core(64, caching=caching)
        for i in range(4):
            core.add(request(f"r{i}", list(range(3, 35)) + [40 + i], max_tokens=2))
            await run_all(core)
        fed[caching] = core.runner.prefill_tokens  # type: ignore[attr-defined]
    assert fed[False] == 4 * 33 and fed[True] == 33 + 3 * 1


def test_reset_forgets_every_key():
    pool = BlockManager(3, 2, enable_caching=True)
    held, idle = pool.allocate(1), pool.allocate(1)
    pool.cache(held[0], block_key(None, [1, 2]))
    pool.cache(idle[0], block_key(None, [3, 4]))
    pool.free(idle)
    pool.reset_cache()
    pool.check_integrity(held=[held])
    assert pool.num_cached_blocks == 0 and pool.num_free_blocks == 2


async def test_the_simulator_charges_prefill_only_for_uncached_tokens():
    from aioserve.sim.simulator import SimConfig, simulate
    from aioserve.workloads.request import WorkloadRequest

    workload = [
        WorkloadRequest(f"r{i}", 0.5 * i, 80, 4, prefix_group="system", prefix_len=64)
        for i in range(4)
    ]
    ends, fed = {}, {}
    for caching in (True, False):
        config = SimConfig(prefill_ms_per_token=1.0, enable_prefix_caching=caching)
        result = await simulate(workload, "fcfs", config)
        ends[caching] = result.runner.clock()
        fed[caching] = result.runner.prefill_tokens
    assert fed[False] == 4 * 80 and fed[True] == 80 + 3 * 16  # 64 cached tokens each
    assert ends[True] < ends[False]
