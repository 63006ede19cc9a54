"""Benchmark requests from a simulator workload (``bench serve --workload``)."""

from __future__ import annotations

from typing import Any

from aioserve.bench.workloads import BenchRequest
from aioserve.sim.runner import FIRST_WORD_ID
from aioserve.sim.scenarios import load_workload
from aioserve.sim.workloads import WorkloadRequest


def body_fields(item: WorkloadRequest) -> dict[str, Any]:
    """The body fields a workload request sets beyond its prompt and length."""
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
    """The requests of a workload (file or name), sent at ``arrival_s``: each stops at its
    ``output_len`` by ``X-Stop-After`` and sends its ``max_tokens`` as a cap (unset: the
    context left, read from the server); ValueError if unreadable."""
    return [BenchRequest(item.prompt_token_ids(vocab_size, FIRST_WORD_ID), item.output_len,
                         item.arrival_s, body_fields(item), item.deadline_s,
                         stop_after=item.output_len, max_tokens=item.max_tokens)
            for item in load_workload(spec)]
