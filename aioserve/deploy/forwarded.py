"""What an ingress forwards to a replica and gets back: plain picklable data, no Ray import."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Response header naming the replica that answered (its Serve replica id).
REPLICA_HEADER = "x-aioserve-replica"

#: Request headers the replica's aiohttp app needs (the rest stay at the ingress);
#: ``x-stop-after`` is ``bench serve --workload``'s hidden stop at a trace's output length;
#: ``authorization``: the replica's app checks the API key.
FORWARDED_HEADERS = ("content-type", "accept", "x-request-id", "x-stop-after",
                     "authorization")

#: Response headers passed back to the client (lower-case).
RETURNED_HEADERS = ("content-type", "cache-control", "x-accel-buffering", "allow",
                    "x-request-id", "retry-after", "www-authenticate")


@dataclass(frozen=True)
class ForwardedRequest:
    """One HTTP request as the ingress received it (lower-case headers)."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class ResponseHead:
    """The first item a replica streams back: status, headers, replica id."""

    status: int
    headers: dict[str, str]
    replica: str

    @property
    def is_event_stream(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")
