"""What the Ray Serve router sees of an OpenAI body: the prompt's token-block hashes, as
the simulator's routers see a workload's (no Ray). Replaces the character prefix key."""

from __future__ import annotations

import json

from aioserve.deploy.route_request import route_request
from aioserve.routing.router import prompt_block_hashes


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def route(body: object, block_size: int = 4):
    return route_request(json.dumps(body).encode(), encode, block_size, "r1")


def test_each_prompt_form_becomes_token_blocks():
    text = "Once upon a time"
    blocks = prompt_block_hashes(encode(text), 4)
    assert len(blocks) == 4
    assert route({"prompt": text, "max_tokens": 7}).block_hashes == blocks
    assert route({"prompt": [text, "Other"]}).block_hashes == blocks  # a batch: its first
    ids = route({"prompt": [12, 345, 6789, 5, 1], "max_tokens": 3})
    assert (ids.num_prompt_tokens, ids.max_tokens) == (5, 3)
    assert ids.block_hashes == prompt_block_hashes([12, 345, 6789, 5], 4)
    assert route({"prompt": [[12, 345, 6789, 5], [6]]}).block_hashes == ids.block_hashes
    chat = {"messages": [{"role": "system", "content": "Be kind"}, {"role": "user"}],
            "max_completion_tokens": 9}
    made = route(chat)
    assert made.block_hashes == prompt_block_hashes(encode("Be kind\n"), 4)
    assert made.max_tokens == 9 and made.request_id == "r1"


def test_prompts_sharing_a_prefix_share_its_blocks():
    one = route({"prompt": "You are a helpful assistant. Question one?"}).block_hashes
    two = route({"prompt": "You are a helpful assistant. Another question"}).block_hashes
    shared = len("You are a helpful assistant. ") // 4
    assert one[:shared] == two[:shared] and one[shared + 1:] != two[shared + 1:]


def test_no_route_without_a_prompt_or_a_tokenizer():
    assert route_request(b"{not json", encode, 4) is None
    assert route_request(b"\xff\xfe", encode, 4) is None
    assert route([1, 2]) is None
    assert route({"prompt": 5}) is None
    assert route({"messages": "hi"}) is None
    assert route_request(json.dumps({"prompt": "text"}).encode(), None, 4) is None
    ids = route_request(json.dumps({"prompt": [1, 2, 3, 4]}).encode(), None, 4)
    assert ids is not None and len(ids.block_hashes) == 1  # token ids need no tokenizer


def test_the_router_sees_on_ray_serve_what_the_cluster_simulator_gives_it():
    """Issue 48 item 7: a body without ``max_tokens`` routes with the context left (as the
    cluster simulator's :meth:`WorkloadRequest.cap`), and with its tenant and priority."""
    from aioserve.request_meta import RequestMeta
    from aioserve.workloads.body import body_fields
    from aioserve.workloads.request import FIRST_WORD_ID, WorkloadRequest

    item = WorkloadRequest("r1", 0.0, 5, 3, meta=RequestMeta(2, "acme"))
    body = {"prompt": item.prompt_token_ids(512, FIRST_WORD_ID), **body_fields(item)}
    made = route_request(json.dumps(body).encode(), None, 4, "r1", max_model_len=64)
    assert made is not None and made.max_tokens == item.cap(64) == 59
    assert (made.meta.tenant, made.meta.priority) == ("acme", 2)
    unknown = route_request(json.dumps({"prompt": [1, 2]}).encode(), None, 4)
    assert unknown is not None and unknown.max_tokens == 0
