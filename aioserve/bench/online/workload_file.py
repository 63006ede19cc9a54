"""Benchmark requests from a simulator workload (``aioserve bench serve --workload
FILE.jsonl``), so a live server replays the very file ``aioserve simulate`` reads."""

from __future__ import annotations

from typing import Any

from aioserve.bench.workloads import BenchRequest
from aioserve.sim.runner import FIRST_WORD_ID
from aioserve.sim.scenarios import load_workload
from aioserve.sim.workloads import WorkloadRequest


def body_fields(item: WorkloadRequest) -> dict[str, Any]:
    """The request-body fields a workload request carries beyond its prompt and length:
    ``priority``, ``user`` (its tenant), the objectives, ``metadata`` and
    ``length_hint`` (only those it sets)."""
    fields: dict[str, Any] = {}
    meta = item.meta
    if meta.priority:
        fields["priority"] = meta.priority
    if meta.tenant is not None:
        fields["user"] = meta.tenant
    for name in ("ttft_slo_ms", "tpot_slo_ms"):
        if getattr(meta, name) is not None:
            fields[name] = getattr(meta, name)
    if item.length_hint is not None:
        fields["length_hint"] = item.length_hint
    if meta.metadata:
        fields["metadata"] = dict(meta.metadata)
    return fields


def workload_requests(spec: str, vocab_size: int) -> list[BenchRequest]:
    """The requests of a workload (a JSONL file or a named workload, as
    ``aioserve simulate --workload``): the simulator's prompt ids, ``output_len``
    tokens each (EOS ignored), sent at ``arrival_s``.

    Raises:
        ValueError: an unreadable workload, or a request whose ``max_tokens`` exceeds its
            ``output_len`` (a server cannot be told where the model stops).
    """
    requests = []
    for item in load_workload(spec):
        if item.limit != item.output_len:
            raise ValueError(f"workload request {item.id!r}: bench serve sends max_tokens = "
                             "output_len (EOS ignored); max_tokens must be unset")
        requests.append(BenchRequest(item.prompt_token_ids(vocab_size, FIRST_WORD_ID),
                                     item.output_len, item.arrival_s, body_fields(item),
                                     item.deadline_s))
    return requests
