"""Production trace formats, told apart by their columns, so a trace file is named as such."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceFormat:
    """A trace format: its name and the columns (CSV header or JSON keys) that mark it."""

    name: str
    columns: frozenset[str]

    @property
    def refusal(self) -> str:
        return f"this looks like {self.name}, not an aioserve workload; not supported yet"


#: The trace formats known by their columns (none is read yet: each is named when met).
TRACE_FORMATS = (
    TraceFormat("a Mooncake trace (JSONL: timestamp, input_length, output_length, hash_ids)",
                frozenset({"timestamp", "input_length", "output_length"})),
    TraceFormat("an Azure LLM inference trace (CSV: TIMESTAMP, ContextTokens, GeneratedTokens)",
                frozenset({"TIMESTAMP", "ContextTokens", "GeneratedTokens"})),
    TraceFormat("an Azure LLM inference trace as processed by Splitwise/Vidur (CSV: arrived_at, "
                "num_prefill_tokens, num_decode_tokens)",
                frozenset({"arrived_at", "num_prefill_tokens", "num_decode_tokens"})),
)


def trace_format(columns: Collection[str]) -> TraceFormat | None:
    found = set(columns)
    return next((f for f in TRACE_FORMATS if f.columns <= found), None)


def first_line_format(line: str) -> TraceFormat | None:
    """The known format of a file's first line (JSON keys, else a CSV header), or None."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError:
        return trace_format([column.strip() for column in line.split(",")])
    return trace_format(list(item)) if isinstance(item, dict) else None
