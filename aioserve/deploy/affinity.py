"""Which replica a prompt belongs to: its prefix key, rendezvous-hashed (no Ray import)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any


def prefix_key(body: bytes, num_chars: int) -> str:
    """The first ``num_chars`` characters of an OpenAI body's prompt (``""`` if none)."""
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(data, dict):
        return ""
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: the first prompt
    if isinstance(prompt, list):
        prompt = " ".join(str(token) for token in prompt)
    if isinstance(prompt, str):
        return prompt[:num_chars]
    messages = data.get("messages")
    if isinstance(messages, list):
        texts = [str(m.get("content", "")) for m in messages if isinstance(m, dict)]
        return "\n".join(texts)[:num_chars]
    return ""


def affinity_order(key: str, replica_ids: Sequence[str]) -> list[str]:
    """``replica_ids`` from most to least preferred for ``key`` (rendezvous hashing)."""

    def weight(replica_id: str) -> bytes:
        return hashlib.blake2b(f"{replica_id}\0{key}".encode(), digest_size=8).digest()

    return sorted(replica_ids, key=weight, reverse=True)
