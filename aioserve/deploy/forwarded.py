"""What an ingress forwards to a replica and what comes back: plain data that Ray can
pickle, with no Ray import, so it is testable without Ray."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Response header naming the replica that answered (its Serve replica id).
REPLICA_HEADER = "x-aioserve-replica"

#: Request headers the replica's aiohttp app needs (the rest stay at the ingress).
FORWARDED_HEADERS = ("content-type", "accept", "x-request-id")

#: Response headers passed back to the client (lower-case).
RETURNED_HEADERS = ("content-type", "cache-control", "x-accel-buffering", "allow",
                    "x-request-id")


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
