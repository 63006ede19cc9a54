"""The prefix key of OpenAI bodies and rendezvous hashing over replicas (no Ray)."""

from __future__ import annotations

import json

from aioserve.deploy.affinity import affinity_order, prefix_key


def key(body: object, num_chars: int = 8) -> str:
    return prefix_key(json.dumps(body).encode(), num_chars)


def test_prefix_key_of_each_prompt_form():
    assert key({"prompt": "Once upon a time"}) == "Once upo"
    assert key({"prompt": ["Once upon a time", "Other"]}) == "Once upo"
    assert key({"prompt": [12, 345, 6789]}, 100) == "12 345 6789"
    assert key({"prompt": [[12, 345], [6]]}, 100) == "12 345"
    chat = {"messages": [{"role": "system", "content": "Be kind"}, {"role": "user"}]}
    assert key(chat, 100) == "Be kind\n"


def test_prefix_key_is_empty_for_anything_else():
    assert prefix_key(b"{not json", 8) == ""
    assert prefix_key(b"\xff\xfe", 8) == ""
    assert key([1, 2]) == ""
    assert key({"prompt": 5}) == ""
    assert key({"messages": "hi"}) == ""


def test_affinity_order_is_deterministic_and_a_permutation():
    ids = ["a1", "b2", "c3", "d4"]
    order = affinity_order("Once upon a time", ids)
    assert sorted(order) == sorted(ids)
    assert affinity_order("Once upon a time", list(reversed(ids))) == order


def test_removing_a_replica_moves_only_its_keys():
    ids = ["a1", "b2", "c3", "d4"]
    keys = [f"prompt {i}" for i in range(400)]
    before = {k: affinity_order(k, ids)[0] for k in keys}
    after = {k: affinity_order(k, ids[:-1])[0] for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == "d4"}
    assert all(len({k for k in keys if before[k] == r}) > 0 for r in ids)
