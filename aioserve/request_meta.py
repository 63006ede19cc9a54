"""Who asks, how urgent it is, and by when it is due (the fields of vLLM's ``priority``,
OpenAI's ``user`` and ``metadata``, DistServe's TTFT and TPOT objectives)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: OpenAI's limits on the ``metadata`` field.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
#: Longest tenant name, in characters.
MAX_TENANT_CHARS = 256
#: ``priority`` fits a signed 64-bit integer.
PRIORITY_MIN, PRIORITY_MAX = -(2**63), 2**63 - 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_number(name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_metadata(metadata: Mapping[str, str]) -> None:
    if not isinstance(metadata, Mapping):
        raise ValueError(f"metadata must be an object of strings, got {type(metadata).__name__}")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ValueError(
            f"metadata may hold at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_METADATA_KEY_CHARS:
            raise ValueError(
                f"metadata keys must be strings of 1 to {MAX_METADATA_KEY_CHARS} characters")
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(f"metadata values must be strings of at most "
                             f"{MAX_METADATA_VALUE_CHARS} characters (key {key!r})")


@dataclass(frozen=True)
class RequestMeta:
    """What a scheduling policy may read about a request besides its tokens.

    The engine never acts on these fields itself; policies do (``priority``, ``vtc``,
    ``edf``, ``mlfq`` in ``schedulers/``), and metrics break down by tenant and priority.

    Attributes:
        priority: lower is served first (vLLM's convention); default 0.
        tenant: who sent the request (the OpenAI ``user`` field, or an ``X-Tenant``
            header); None when not given (policies treat all such requests as one tenant).
        ttft_slo_ms: time-to-first-token objective in milliseconds (> 0), or None.
        tpot_slo_ms: time-per-output-token objective in milliseconds (> 0), or None.
        deadline: absolute time, in seconds since the Unix epoch (``time.time()``), by
            which the whole request should have finished, or None. Policies read it on
            the engine's clock as ``RequestView.deadline``.
        metadata: free string pairs (the OpenAI ``metadata`` field), passed to policies
            untouched; at most 16 pairs, keys of 1-64 and values of 0-512 characters.
            Stored read-only.

    Raises:
        ValueError: a field is out of range; the message starts with the field's name.
    """

    priority: int = 0
    tenant: str | None = None
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    deadline: float | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _is_int(self.priority) or not PRIORITY_MIN <= self.priority <= PRIORITY_MAX:
            raise ValueError(f"priority must be an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}], "
                             f"got {self.priority!r}")
        tenant = self.tenant
        if tenant is not None and (
            not isinstance(tenant, str) or not 0 < len(tenant) <= MAX_TENANT_CHARS
        ):
            raise ValueError(f"tenant must be a string of 1 to {MAX_TENANT_CHARS} characters")
        _positive_number("ttft_slo_ms", self.ttft_slo_ms)
        _positive_number("tpot_slo_ms", self.tpot_slo_ms)
        _positive_number("deadline", self.deadline)
        _check_metadata(self.metadata)
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))


#: The metadata of a request that gave none.
DEFAULT_META = RequestMeta()
