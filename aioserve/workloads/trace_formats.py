"""Production trace formats, told apart by their columns before any key is checked."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceFormat:
    """A trace format: its name, the columns (CSV header or JSON keys) that mark it, and the
    columns read as (arrival, prompt tokens, output tokens, prefix-block ids or "")."""

    name: str
    columns: frozenset[str]
    key: str = ""
    read: tuple[str, str, str, str] = ("", "", "", "")

    @property
    def refusal(self) -> str:
        return (f"this looks like {self.name}, not an aioserve workload row "
                "(a trace is read as a whole file: --workload FILE[:options])")


MOONCAKE = TraceFormat(
    "a Mooncake trace (JSONL: timestamp, input_length, output_length, hash_ids)",
    frozenset({"timestamp", "input_length", "output_length"}), "mooncake",
    ("timestamp", "input_length", "output_length", "hash_ids"))
AZURE = TraceFormat(
    "an Azure LLM inference trace (CSV: TIMESTAMP, ContextTokens, GeneratedTokens)",
    frozenset({"TIMESTAMP", "ContextTokens", "GeneratedTokens"}), "azure-original",
    ("TIMESTAMP", "ContextTokens", "GeneratedTokens", ""))
AZURE_PROCESSED = TraceFormat(
    "an Azure LLM inference trace as processed by Splitwise/Vidur (CSV: arrived_at, "
    "num_prefill_tokens, num_decode_tokens)",
    frozenset({"arrived_at", "num_prefill_tokens", "num_decode_tokens"}), "azure",
    ("arrived_at", "num_prefill_tokens", "num_decode_tokens", ""))

#: The trace formats known by their columns.
TRACE_FORMATS = (MOONCAKE, AZURE, AZURE_PROCESSED)


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


def unknown_header(line: str) -> str:
    """What is wrong with a file's first line that is neither JSON nor a known trace's
    header ("" when it is JSON): the columns it has and those each format needs."""
    try:
        json.loads(line)
        return ""
    except json.JSONDecodeError:
        pass
    known = "; ".join(f.name for f in TRACE_FORMATS)
    if "," in line:
        seen = ", ".join(column.strip() for column in line.split(","))
        return f"CSV header with columns {seen}: no trace format has these (known: {known})"
    return (f"not JSON: a workload file holds one JSON object per line (JSON Lines); "
            f"got {line.strip()[:60]!r} (traces known: {known})")
