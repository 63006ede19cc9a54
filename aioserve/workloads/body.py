"""The mapping from a workload request to the body an OpenAI-style server takes."""

from __future__ import annotations

from typing import Any

from aioserve.workloads.request import WorkloadRequest


def body_fields(item: WorkloadRequest, unix_zero: float = 0.0) -> dict[str, Any]:
    """The body fields a workload request sets beyond its prompt and length (its deadline
    as Unix seconds, for a run whose zero is ``unix_zero``)."""
    fields: dict[str, Any] = {}
    meta = item.meta
    if meta.priority:
        fields["priority"] = meta.priority
    if meta.tenant is not None:
        fields["user"] = meta.tenant
    if meta.ttft_slo_ms is not None:
        fields["ttft_slo_ms"] = meta.ttft_slo_ms
    if meta.tpot_slo_ms is not None:
        fields["tpot_slo_ms"] = meta.tpot_slo_ms
    if item.length_hint is not None:
        fields["length_hint"] = item.length_hint
    if meta.metadata:
        fields["metadata"] = dict(meta.metadata)
    if item.deadline_s is not None:
        fields["deadline"] = unix_zero + item.deadline_s
    return fields

