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
