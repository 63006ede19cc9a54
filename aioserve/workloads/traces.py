"""Readers of production traces (Azure CSV, Mooncake JSONL) into workload requests.

Times become seconds from the trace's first row; lengths stay as recorded, a length of 0
read as 1 (a request has at least one prompt and one output token). Mooncake's
``hash_ids`` become :attr:`WorkloadRequest.prefix_blocks` of 512 tokens each."""

from __future__ import annotations

import csv
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from aioserve.workloads.request import WorkloadRequest, json_lines
from aioserve.workloads.trace_formats import TraceFormat, first_line_format

#: Tokens per prefix block in Mooncake's release.
MOONCAKE_BLOCK_TOKENS = 512


def detect(path: str | Path) -> TraceFormat | None:
    """The trace format of a file by its first non-empty line's columns, or None."""
    with open(path, encoding="utf-8") as file:
        for line in file:
            if line.strip():
                return first_line_format(line)
    return None


def _time(value: Any, column: str) -> float:
    if isinstance(value, str) and column == "TIMESTAMP":
        head, _, fraction = value.strip().partition(".")
        stamp = datetime.fromisoformat(head)  # ValueError: not a date-time
        return stamp.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)
    number = float(value)
    if not number >= 0 or number == float("inf"):
        raise ValueError
    return number / 1000 if column == "timestamp" else number


def _count(value: Any, _column: str) -> int:
    number = float(value)
    if isinstance(value, bool) or not number >= 0 or number != int(number):
        raise ValueError
    return max(int(number), 1)


def _blocks(value: Any, _column: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError
    return tuple(value)


#: How each kind of column is read, and what it must hold.
_KINDS: dict[str, tuple[Callable[[Any, str], Any], str]] = {
    "time": (_time, "a time (seconds; ms for Mooncake; a date-time for TIMESTAMP) >= 0"),
    "tokens": (_count, "a whole number of tokens >= 0"),
    "blocks": (_blocks, "a list of integer block ids"),
}


def _rows(path: Path, found: TraceFormat) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs; a CSV row missing fields has them None."""
    with open(path, encoding="utf-8", newline="") as file:
        if found.key == "mooncake":
            rows = []
            for number, item in json_lines(path, file):
                if not isinstance(item, dict):
                    raise ValueError(f"{path}:{number}: not a JSON object")
                rows.append((number, item))
            return rows
        reader = csv.DictReader(file, skipinitialspace=True)
        return [(reader.line_num, row) for row in reader if any(row.values())]


def _field(row: dict[str, Any], column: str, kind: str, at: str) -> Any:
    """One column's value, parsed; ValueError ``FILE:LINE: column 'NAME' ...``."""
    value = row.get(column)
    if value is None or value == "":
        raise ValueError(f"{at}: column {column!r} missing")
    parse, expected = _KINDS[kind]
    try:
        return parse(value, column)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{at}: column {column!r}: expected {expected}, got {value!r}") from None


def read_trace(path: str | Path, found: TraceFormat) -> list[WorkloadRequest]:
    """A trace file's requests in arrival order, ids ``STEM-ROW`` (row from 0, file order).

    Raises:
        ValueError: ``FILE:LINE: column 'NAME' ...``: a column missing or not a number."""
    path = Path(path)
    arrival, prompt, output, blocks = found.read
    parsed: list[tuple[float, int, int, int, tuple[int, ...]]] = []
    for index, (number, row) in enumerate(_rows(path, found)):
        at = f"{path}:{number}"
        parsed.append((_field(row, arrival, "time", at), index, _field(row, prompt, "tokens", at),
                       _field(row, output, "tokens", at),
                       _field(row, blocks, "blocks", at) if blocks else ()))
    if not parsed:
        raise ValueError(f"{path}: no requests")
    parsed.sort(key=lambda r: r[0])
    zero = parsed[0][0]
    return [WorkloadRequest(
        f"{path.stem}-{index}", round(time - zero, 6), prompt_len, output_len,
        prefix_blocks=ids, block_tokens=MOONCAKE_BLOCK_TOKENS if ids else 0)
        for time, index, prompt_len, output_len, ids in parsed]
