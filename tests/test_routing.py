"""Issue 32, item 3: the router contract and the built-in routers' rules, and the
registry (built-in names, entry points, ``"package.module:Class"``, errors)."""

from __future__ import annotations

import math
import random

import pytest

from aioserve.routing.balance import LeastOutstanding, PowerOfTwo, RoundRobin
from aioserve.routing.prefix import PrefixAffinity
from aioserve.routing.registry import available_routers, load_router
from aioserve.routing.router import ReplicaLoad, Router, RouteRequest, prompt_block_hashes


def request(name: str = "r", blocks: tuple[int, ...] = (), prompt: int = 64) -> RouteRequest:
    return RouteRequest(name, prompt, 16, blocks)


def loads(*requests: int, tokens: tuple[int, ...] | None = None) -> list[ReplicaLoad]:
    tokens = tokens or tuple(0 for _ in requests)
    return [ReplicaLoad(r, t, 100, 100) for r, t in zip(requests, tokens)]


def test_round_robin_goes_in_order_whatever_the_load():
    router = RoundRobin()
    picks = [router.choose(request(), loads(9, 0, 5)) for _ in range(7)]
    assert picks == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_by_requests_or_tokens():
    snapshot = loads(3, 1, 2, 1, tokens=(10, 900, 50, 400))
    assert LeastOutstanding().choose(request(), snapshot) == 1  # fewest requests, lowest index
    assert LeastOutstanding(by="tokens").choose(request(), snapshot) == 0


def test_pow2_takes_the_less_loaded_of_two_seeded_draws():
    snapshot = loads(5, 0, 7, 3)
    router, draws = PowerOfTwo(seed=7), random.Random(7)
    picks = []
    for _ in range(50):
        first, second = draws.sample(range(4), 2)
        load = [s.outstanding_requests for s in snapshot]
        expected = second if load[second] < load[first] else first
        picks.append(router.choose(request(), snapshot))
        assert picks[-1] == expected
    assert 2 not in picks  # the most loaded never wins a draw
    again = PowerOfTwo(seed=7)
    assert [again.choose(request(), snapshot) for _ in range(50)] == picks
    other = PowerOfTwo(seed=8)
    assert [other.choose(request(), snapshot) for _ in range(50)] != picks
    assert PowerOfTwo().choose(request(), loads(4)) == 0


def route_all(router: Router, requests: list[RouteRequest], replicas: int) -> list[int]:
    """Route in order; nothing finishes, so each replica's load is what it was sent."""
    counts = [0] * replicas
    picks = []
    for item in requests:
        index = router.choose(item, loads(*counts))
        counts[index] += 1
        picks.append(index)
    return picks


def test_prefix_keeps_a_shared_prompt_on_one_replica_until_the_bound_then_spills():
    hashes = prompt_block_hashes(list(range(3, 3 + 64)), 16)
    assert len(hashes) == 4
    router = PrefixAffinity(load_bound=0.25)
    picks = route_all(router, [request(f"r{i}", hashes) for i in range(40)], 4)
    home = picks[0]
    counts, holders = [0] * 4, set()
    for index in picks:
        mean = (sum(counts) + 1) / 4
        bound = math.ceil(max(1.25 * mean, mean + 2))
        assert counts[index] + 1 <= bound  # the filter: never past (1 + eps) x the mean
        if index not in holders and holders:
            assert all(counts[h] + 1 > bound for h in holders)  # spills only when all are full
        counts[index] += 1
        holders.add(index)
    assert picks[:3] == [home] * 3 and picks[3] != home and len(set(picks)) == 4
    assert max(counts) <= 13  # 40 requests: mean 10, bound max(1.25 x 10, 10 + 2)
    # without a bound, one shared prompt pins everything on one replica
    assert set(route_all(PrefixAffinity(load_bound=1e9), [request(f"r{i}", hashes)
                                                           for i in range(40)], 4)) == {home}


def test_prefix_gives_each_prompt_a_home_and_prefers_the_longest_match():
    a = prompt_block_hashes(list(range(10, 74)), 16)
    b = prompt_block_hashes(list(range(200, 264)), 16)
    router = PrefixAffinity(load_bound=10.0)
    even = loads(0, 0, 0, 0)
    home_a = router.choose(request("a0", a), even)
    assert router.choose(request("a1", a), even) == home_a
    # a prompt sharing a's first two blocks goes where those blocks are
    partial = prompt_block_hashes(list(range(10, 42)) + list(range(300, 332)), 16)
    assert partial[:2] == a[:2] and partial[2:] != a[2:]
    assert router.choose(request("p", partial), even) == home_a
    # with a's home loaded, b (no match anywhere) goes to the least loaded
    skewed = [ReplicaLoad(5 if i == home_a else 1 + i, 0, 100, 100) for i in range(4)]
    assert router.choose(request("b", b), skewed) == (1 if home_a == 0 else 0)


def test_prefix_index_forgets_past_its_capacity_tail_blocks_first():
    router = PrefixAffinity(load_bound=10.0, capacity_blocks=4)
    first = prompt_block_hashes(list(range(10, 74)), 16)
    assert router.choose(request("a", first), loads(0, 9)) == 0
    assert router.matched(0, first) == 4
    other = prompt_block_hashes(list(range(300, 332)), 16)
    assert router.choose(request("b", other), loads(0, 9)) == 0
    assert router.matched(0, first) == 2 and router.matched(0, other) == 2


def test_block_hashes_are_prefix_chained():
    one = prompt_block_hashes([5] * 40, 16)
    two = prompt_block_hashes([5] * 32 + [6] * 8, 16)
    assert len(one) == 2 and one == two  # the partial third block is not hashed
    assert prompt_block_hashes([6] * 16 + [5] * 16, 16)[1] != one[1]  # chained over the parent


class FirstReplica:
    """Always replica 0 (a third party's router)."""

    name = "first"

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def choose(self, request, loads):
        return self.offset


def test_registry_builds_built_ins_with_parameters():
    assert {"round_robin", "least_outstanding", "pow2", "prefix"} <= set(available_routers())
    router = load_router("prefix", {"load_bound": 0.5, "by": "tokens"})
    assert isinstance(router, PrefixAffinity) and router.load_bound == 0.5
    assert isinstance(load_router("pow2", {"seed": 3}), PowerOfTwo)
    instance = RoundRobin()
    assert load_router(instance) is instance


def test_registry_loads_module_class_and_entry_points(tmp_path, monkeypatch):
    (tmp_path / "first_router.py").write_text(
        "class First:\n    name = 'first'\n\n    def choose(self, request, loads):\n"
        "        return 0\n")
    dist = tmp_path / "first_router-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: first-router\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[aioserve.routers]\nfirst = first_router:First\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "first" in available_routers()
    assert type(load_router("first")).__name__ == "First"
    assert type(load_router("first_router:First")).__name__ == "First"


@pytest.mark.parametrize(("spec", "params", "message"), [
    ("nope", None, "unknown router 'nope'; registered: least_outstanding, pow2, prefix"),
    ("no_such_module:X", None, "cannot import 'no_such_module'"),
    ("random:Random", None, "has no choose(request, loads) method"),
    ("prefix", {"load_bond": 1}, "router 'prefix' has no parameter 'load_bond' (it takes: "),
    ("prefix", {"load_bound": -1}, "load_bound, load_slack, prefix_weight and load_weight must"),
    ("least_outstanding", {"by": "bytes"}, "parameter 'by'"),
])
def test_registry_errors_name_what_is_wrong(spec, params, message):
    with pytest.raises(ValueError) as exc:
        load_router(spec, params)
    assert message in str(exc.value)
