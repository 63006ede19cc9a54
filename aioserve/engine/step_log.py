"""The step log: an engine observer writing each step as a JSON line, to fit the simulator's
step cost on the server that runs (``aioserve serve --step-log``, then ``aioserve simulate
--calibrate --from-steps``, which reads it with :func:`read_step_log`).

Line 1 is ``{"engine": {...}}`` (what :func:`describe` records: model, device, threads,
slots, KV blocks, ...); every other line is one
:class:`~aioserve.scheduling.StepFeedback`, its fields by name, times in seconds on the
engine's clock. A served step carries what serving adds to it on the same cores (HTTP,
tokenizing, streaming), which an in-process calibration does not see. A step's time runs
from the end of the step before it (or its submission, when later) to when its tokens
reached the engine: scheduled one step ahead, a step whose tokens came back late leaves
its successor short (under a millisecond), while the sum over steps holds."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import platform
from dataclasses import fields
from pathlib import Path
from typing import IO, Any

import aioserve
from aioserve.engine.async_engine import AsyncEngine
from aioserve.scheduling import StepFeedback

logger = logging.getLogger("aioserve.step_log")

_FIELDS = tuple(f.name for f in fields(StepFeedback))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _list_of(check: Any) -> Any:
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


_IDS = (_list_of(lambda item: isinstance(item, str)), "a list of strings")
_COUNTS = (_list_of(_count), "a list of integers >= 0")
_TIME = (_time, "a number (seconds)")
#: What each field of a step line must hold, and how an error says it.
_RULES: dict[str, tuple[Any, str]] = {
    "step": (_count, "an integer >= 0"), "start_time": _TIME, "end_time": _TIME,
    "request_ids": _IDS, "num_computed_tokens": _COUNTS, "start_positions": _COUNTS,
    "num_emitted_tokens": _COUNTS,
    "is_decode": (_list_of(lambda item: isinstance(item, bool)), "a list of true/false"),
    "finished": _IDS}


def describe(engine: AsyncEngine) -> dict[str, Any]:
    """What a profile was measured on: model, device, threads, engine settings, machine."""
    config = engine.config
    core = engine._require_core()
    info = engine.runner_info()
    return {
        "model": config.model,
        "device": info.device or config.device,
        "forward": info.forward or config.forward,
        "dtype": info.dtype or config.dtype,
        "threads": os.environ.get("AIOSERVE_NUM_THREADS", "default"),
        "torch_threads": info.threads,
        "thread_governor": bool(info.thread_choices),
        "slots": core.max_num_seqs, "kv_blocks": core.blocks.num_blocks,
        "block_size": core.blocks.block_size,
        "max_num_batched_tokens": core.max_num_batched_tokens,
        "max_model_len": core.max_model_len,
        "enable_prefix_caching": core.blocks.enable_caching,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(), "aioserve": aioserve.__version__,
        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


class StepLog:
    """An engine observer: once attached, writes the engine's description and then each of
    its steps to ``path`` (overwritten), one line as it ends (line buffered: readable while
    the server runs; about 180 bytes a step and 56 a row, most of it request ids)."""

    def __init__(self, engine: AsyncEngine, path: str | Path) -> None:
        self.engine = engine
        self.path = Path(path)
        self._file: IO[str] | None = None

    def attach(self) -> None:
        """Open the file (OSError: it cannot be), write the engine line, log from now on."""
        self._file = self.path.open("w", buffering=1)
        self._line({"engine": describe(self.engine)})
        self.engine.add_step_observer(self.write)

    def detach(self) -> None:
        """Stop logging and close the file."""
        self.engine.remove_step_observer(self.write)
        self.close()

    def write(self, step: StepFeedback) -> None:
        """One step's line."""
        self._line({name: getattr(step, name) for name in _FIELDS})  # no deep copy

    def _line(self, record: dict[str, Any]) -> None:
        """A failed write (a full disk) stops the log with a warning, never the engine."""
        if self._file is None or self._file.closed:
            return
        try:
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        except OSError as exc:
            logger.warning("step log %s: cannot write (%s); no more steps are logged",
                           self.path, exc.strerror or exc)
            self.close()

    def close(self) -> None:
        """Close the file (again: nothing); a failed final flush is ignored."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()


def read_step_log(path: str | Path) -> tuple[dict[str, Any], list[StepFeedback]]:
    """The engine description and the steps of a step log.

    Raises:
        ValueError: the file is missing, or a line is not what :class:`StepLog` writes
            (the message names the file, the line and the field)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"no step log {str(path)!r} ({exc.strerror})") from None
    engine: dict[str, Any] | None = None
    steps: list[StepFeedback] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not text.endswith("\n") and engine is not None:
                break  # the last line cut short: a server stopped while writing it
            raise ValueError(f"{where}: not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: not a JSON object")
        if engine is None:
            if not isinstance(record.get("engine"), dict):
                raise ValueError(f"{where}: the first line must be {{\"engine\": {{...}}}} "
                                 "(written by aioserve serve --step-log)")
            engine = record["engine"]
            continue
        missing = [name for name in _FIELDS if name not in record]
        if missing:
            raise ValueError(f"{where}: no field {missing[0]!r}")
        for name in _FIELDS:
            check, wanted = _RULES[name]
            if not check(record[name]):
                raise ValueError(f"{where}: field {name!r} must be {wanted}, got "
                                 f"{record[name]!r}")
        rows = {name: len(record[name]) for name in _FIELDS[3:-1]}
        if len(set(rows.values())) > 1:
            raise ValueError(f"{where}: one entry a row in each of {', '.join(rows)}, got "
                             f"{', '.join(map(str, rows.values()))}")
        steps.append(StepFeedback(record["step"], record["start_time"], record["end_time"],
                                  *(tuple(record[name]) for name in _FIELDS[3:])))
    if engine is None:
        raise ValueError(f"{path}: empty (no engine line)")
    return engine, steps
