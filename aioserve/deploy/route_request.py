"""What the router sees of an OpenAI request body: its prompt's token blocks (no Ray import)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from aioserve.request_meta import DEFAULT_META, RequestMeta
from aioserve.routing.router import RouteRequest, prompt_block_hashes

#: Text -> token ids (the served model's tokenizer).
Encode = Callable[[str], Sequence[int]]


def prompt_of(data: Any) -> str | list[int] | None:
    """A completion's prompt (a batch: its first), or a chat's message contents joined."""
    if not isinstance(data, dict):
        return None
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) or (isinstance(prompt, list)
                                   and all(isinstance(t, int) for t in prompt)):
        return prompt
    messages = data.get("messages")
    if isinstance(messages, list):
        return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    return None


def route_request(body: bytes, encode: Encode | None, block_size: int,
                  request_id: str = "", max_model_len: int | None = None) -> RouteRequest | None:
    """The :class:`RouteRequest` of a body: its prompt's token-block hashes (text encoded
    with ``encode``), length, ``max_tokens`` (unset: the context left of ``max_model_len``,
    as the engine and the cluster simulator default it; 0 when that is unknown too) and its
    tenant (``user``) and ``priority``, as the cluster simulator gives a router; None when
    the body has no prompt, or text and no ``encode``."""
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    prompt = prompt_of(data)
    if prompt is None or (isinstance(prompt, str) and encode is None):
        return None
    ids = list(encode(prompt)) if isinstance(prompt, str) and encode is not None else prompt
    limit = data.get("max_tokens") or data.get("max_completion_tokens") or 0
    limit = limit if isinstance(limit, int) and not isinstance(limit, bool) else 0
    assert isinstance(ids, list)
    if not limit and max_model_len is not None:
        limit = max(max_model_len - len(ids), 1)
    user, priority = data.get("user"), data.get("priority")
    try:
        meta = RequestMeta(priority=priority if type(priority) is int else 0,
                           tenant=user if isinstance(user, str) else None)
    except ValueError:  # the replica refuses the body with a 400 naming the field
        meta = DEFAULT_META
    return RouteRequest(request_id, len(ids), limit, prompt_block_hashes(ids, block_size),
                        block_size, meta)
