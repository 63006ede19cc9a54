"""What an ingress forwards to a replica and what comes back: plain data that Ray can
pickle, with no Ray import, so it is testable without Ray."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: Response header naming the replica that answered (its Serve replica id).
REPLICA_HEADER = "x-aioserve-replica"

#: Request headers the replica's aiohttp app needs (the rest stay at the ingress).
FORWARDED_HEADERS = ("content-type", "accept")

#: Response headers passed back to the client (lower-case).
RETURNED_HEADERS = ("content-type", "cache-control", "x-accel-buffering", "allow")


@dataclass(frozen=True)
class ForwardedRequest:
    """One HTTP request, as the ingress received it.

    Attributes:
        method: ``GET``, ``POST``…
        path: the path and query string (``/v1/completions``).
        headers: the :data:`FORWARDED_HEADERS` the client sent (lower-case names).
        body: the raw body in bytes.
    """

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class ResponseHead:
    """The first item a replica streams back: status and headers of its answer.

    Attributes:
        status: HTTP status code.
        headers: the :data:`RETURNED_HEADERS` of the answer (lower-case names).
        replica: the Serve replica id that answered.
    """

    status: int
    headers: dict[str, str]
    replica: str

    @property
    def is_event_stream(self) -> bool:
        """True when the body is Server-Sent Events."""
        return self.headers.get("content-type", "").startswith("text/event-stream")


def prefix_key(body: bytes, num_chars: int) -> str:
    """The first ``num_chars`` characters of the prompt of an OpenAI body, the key the
    prefix-affinity router hashes: ``prompt`` (a string, the first string of a list, or
    token ids written out) or the chat ``messages``' contents joined. ``""`` when the
    body is not such JSON (the router then balances by load alone)."""
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
