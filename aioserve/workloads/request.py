"""The request of a workload (one type for the simulator, the real replay and the bench
clients), the article's two workloads, a bursty Poisson stream, and JSON Lines files."""

from __future__ import annotations

import difflib
import hashlib
import json
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from aioserve.request_meta import DEFAULT_META, RequestMeta
from aioserve.workloads.trace_formats import first_line_format, trace_format, unknown_header

#: Nanoseconds per second (the simulator's clock counts integer nanoseconds).
NS_PER_S = 1_000_000_000

#: The first id of ordinary (non-EOS, non-BOS) tokens a drawn prompt uses.
FIRST_WORD_ID = 3

#: Most requests a generated workload may hold (``n=``): a bound, so a typo cannot run for ever.
MAX_REQUESTS = 1_000_000

#: Prompt length of the article's requests (it counts decode steps only; with the
#: default prefill cost of 0 the prompt length changes no timing, only KV use).
ARTICLE_PROMPT_LEN = 16


def _draw(key: str, count: int, low: int, high: int) -> list[int]:
    """``count`` token ids in ``[low, high)`` drawn from ``key`` alone (so the simulator
    and ``bench serve`` build the same prompt, and equal keys share tokens)."""
    if count <= 0:
        return []
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    ids: list[int] = np.random.Generator(np.random.PCG64(seed)).integers(
        low, high, count).tolist()
    return ids


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload, simulated, replayed or sent to a server (times in seconds
    on the workload's clock, lengths in tokens).

    Attributes:
        output_len: output tokens it generates, the last one EOS (>= 1).
        length_hint: predicted output tokens given to the scheduler, or None.
        after_start: on a tie with a step boundary, arrive just after that step was
            scheduled (the article's request E, "just after the batch starts").
        prefix_group, prefix_len: requests of one group share their first ``prefix_len``
            prompt tokens.
        max_tokens: the client's output cap (None: the context left, ``max_model_len -
            prompt_len``, as a client that sets none); the request still stops after
            ``output_len`` tokens by a hidden stop the policy cannot see (a scripted EOS in
            the simulator, ``stop_after`` on the engine, ``X-Stop-After`` over HTTP).
        meta: priority, tenant, objectives and metadata (its ``deadline`` unset: see
            ``deadline_s``); a workload file's keys of the same names build it.
        deadline_s: when it should be done, or None.
        prefix_blocks, block_tokens: a trace's prefix-block ids (Mooncake ``hash_ids``), each
            ``block_tokens`` prompt tokens drawn from its id alone, so equal ids are equal
            tokens (the prompt's leading blocks; ``prefix_group`` is then unused).
        prompt_ids: the prompt's token ids where they are given (the bench's synthetic
            datasets); empty: drawn from the id and the prefix fields."""

    id: str
    arrival_s: float
    prompt_len: int
    output_len: int
    length_hint: int | None = None
    after_start: bool = False
    prefix_group: str | None = None
    prefix_len: int = 0
    max_tokens: int | None = None
    meta: RequestMeta = DEFAULT_META
    deadline_s: float | None = None
    prefix_blocks: tuple[int, ...] = ()
    block_tokens: int = 0
    prompt_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1 or self.arrival_s < 0:
            raise ValueError(
                f"workload request {self.id!r}: prompt_len and output_len must be >= 1 "
                "and arrival_s >= 0"
            )
        if not 0 <= self.prefix_len <= self.prompt_len:
            raise ValueError(f"workload request {self.id!r}: prefix_len must be 0..prompt_len")
        if self.max_tokens is not None and self.max_tokens < self.output_len:
            raise ValueError(f"workload request {self.id!r}: max_tokens must be >= output_len")
        if self.deadline_s is not None and not 0 <= self.deadline_s < float("inf"):
            raise ValueError(f"workload request {self.id!r}: deadline_s must be >= 0")
        if self.prefix_blocks and self.block_tokens < 1:
            raise ValueError(f"workload request {self.id!r}: block_tokens must be >= 1")
        if self.prompt_ids and len(self.prompt_ids) != self.prompt_len:
            raise ValueError(f"workload request {self.id!r}: prompt_len must be "
                             "len(prompt_ids)")

    @property
    def stop_after(self) -> int | None:
        """The hidden stop sent (``X-Stop-After``): ``output_len``, unless the cap is exactly
        that (then the request ends by length)."""
        return None if self.max_tokens == self.output_len else self.output_len

    def cap(self, max_model_len: int) -> int:
        """The ``max_tokens`` it sends: the workload's, else the context left (>= 1)."""
        return self.max_tokens if self.max_tokens is not None else max(
            max_model_len - self.prompt_len, 1)

    def meta_from(self, unix_epoch: float | None = None) -> RequestMeta:
        """Its meta; for a run whose zero is ``unix_epoch``, with the deadline in Unix
        seconds (no copy when nothing changes)."""
        if self.deadline_s is None or unix_epoch is None:
            return self.meta
        return replace(self.meta, deadline=unix_epoch + self.deadline_s)

    def prompt_token_ids(self, vocab_size: int, low_id: int) -> list[int]:
        """Its group's shared prefix (or prefix blocks), then tokens of its own (ids in
        ``[low_id, vocab_size)``), or its ``prompt_ids``."""
        if self.prompt_ids:
            return list(self.prompt_ids)
        if self.prefix_blocks:
            return self._block_token_ids(vocab_size, low_id)
        shared = self.prefix_len if self.prefix_group is not None else 0
        return (_draw(f"prefix:{self.prefix_group}", shared, low_id, vocab_size)
                + _draw(f"request:{self.id}", self.prompt_len - shared, low_id, vocab_size))

    def _block_token_ids(self, vocab_size: int, low_id: int) -> list[int]:
        ids: list[int] = []
        for block in self.prefix_blocks:
            if len(ids) >= self.prompt_len:
                break
            ids += _draw(f"block:{block}:{self.block_tokens}", self.block_tokens, low_id,
                         vocab_size)
        ids += _draw(f"request:{self.id}", max(self.prompt_len - len(ids), 0), low_id,
                     vocab_size)
        return ids[: self.prompt_len]

    @property
    def arrival_ns(self) -> int:
        return round(self.arrival_s * NS_PER_S)


def article_example() -> list[WorkloadRequest]:
    """The article's example: A=100, B=20, C=50, D=200 decode steps at t=0; E=30 just after."""
    lengths = {"A": 100, "B": 20, "C": 50, "D": 200}
    requests = [WorkloadRequest(k, 0.0, ARTICLE_PROMPT_LEN, n) for k, n in lengths.items()]
    return [*requests, WorkloadRequest("E", 0.0, ARTICLE_PROMPT_LEN, 30, after_start=True)]


def article_mix(count: int = 100) -> list[WorkloadRequest]:
    """The article's mix: ``count`` requests at t=0 alternating 20 and 200 tokens."""
    return [
        WorkloadRequest(f"r{i:03d}", 0.0, ARTICLE_PROMPT_LEN, 20 if i % 2 == 0 else 200)
        for i in range(count)
    ]


def poisson(
    n: int = 200, rate: float = 1.0, burst: float = 4.0, seed: int = 0
) -> list[WorkloadRequest]:
    """A bursty Poisson stream at ``rate`` requests/s: geometric bursts of mean ``burst``; 70 %
    short (8-64 output tokens), 30 % long (128-512), prompts 16-256 tokens."""
    if not 1 <= n <= MAX_REQUESTS or rate <= 0 or burst < 1:
        raise ValueError(f"poisson workload needs 1 <= n <= {MAX_REQUESTS:,}, rate > 0 and "
                         "burst >= 1")
    rng = random.Random(seed)
    requests: list[WorkloadRequest] = []
    for i, t in enumerate(bursty_arrivals(n, rate, burst, rng)):
        out = rng.randint(8, 64) if rng.random() < 0.7 else rng.randint(128, 512)
        requests.append(WorkloadRequest(f"p{i:04d}", t, rng.randint(16, 256), out))
    return requests


def bursty_arrivals(n: int, rate: float, burst: float, rng: random.Random) -> Iterator[float]:
    """``n`` arrival times at ``rate`` per second in geometric bursts of mean ``burst``."""
    t, sent = 0.0, 0
    while sent < n:
        t += rng.expovariate(rate / burst)
        size = 1
        while rng.random() > 1 / burst:
            size += 1
        for _ in range(min(size, n - sent)):
            sent += 1
            yield round(t, 6)


#: Workload file fields and their JSON types (``id`` may be a string or a number).
_FIELDS: dict[str, tuple[type, ...]] = {
    "arrival_s": (int, float), "prompt_len": (int,), "output_len": (int,),
    "length_hint": (int,), "after_start": (bool,), "prefix_group": (str,),
    "prefix_len": (int,), "max_tokens": (int,), "priority": (int,), "tenant": (str,),
    "ttft_slo_ms": (int, float), "tpot_slo_ms": (int, float), "deadline_s": (int, float),
    "metadata": (dict,), "prefix_blocks": (list,), "block_tokens": (int,),
}
_REQUIRED = ("id", "arrival_s", "prompt_len", "output_len")
#: The file's keys that are :class:`RequestMeta` fields (its deadline is ``deadline_s``).
_META_KEYS = tuple(f.name for f in fields(RequestMeta) if f.name in _FIELDS)


def parse_request(item: Any) -> WorkloadRequest:
    """One workload request from a JSON object; a ValueError names the bad key or field."""
    if not isinstance(item, dict):
        raise ValueError("not a JSON object")
    unknown = [name for name in item if name != "id" and name not in _FIELDS]
    if unknown:
        found = trace_format(list(item))
        if found is not None:
            raise ValueError(found.refusal)
        raise ValueError(unknown_key(unknown[0]))
    for name in _REQUIRED:
        if name not in item:
            raise ValueError(f"{name} is required")
    kwargs: dict[str, Any] = {}
    for name, value in item.items():
        types = _FIELDS.get(name)
        if types is None or value is None:
            continue  # null means "not set"
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise ValueError(f"{name} must be of type {types[0].__name__}, got {value!r}")
        kwargs[name] = value
    if "prefix_blocks" in kwargs:
        blocks = kwargs["prefix_blocks"]
        if not all(type(block) is int for block in blocks):
            raise ValueError(f"prefix_blocks must be a list of integers, got {blocks!r}")
        kwargs["prefix_blocks"] = tuple(blocks)
    meta = {name: kwargs.pop(name) for name in _META_KEYS if name in kwargs}
    try:
        kwargs["meta"] = RequestMeta(**meta)
    except ValueError as exc:
        raise ValueError(f"workload request {item['id']!r}: {exc}") from None
    return WorkloadRequest(str(item["id"]), **kwargs)


def unknown_key(name: str) -> str:
    """The refusal of a key no workload request has: the closest known one, and all."""
    known = ["id", *_FIELDS]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key {name!r}{hint} (known: {', '.join(known)})"


def json_lines(path: str | Path, lines: Iterable[str]) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line; ValueError ``FILE:LINE: not JSON``."""
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None


def load_jsonl(path: str | Path) -> list[WorkloadRequest]:
    """Read a workload file, one JSON object per line (keys: docs/schedulers.md).

    Raises:
        ValueError: ``FILE:LINE: `` and what is wrong (a key, a field's type or value), a
            repeated id, or a production trace's columns (named).
        OSError: the file cannot be read."""
    lines = Path(path).read_text().splitlines()
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        raise ValueError(f"{path}: no requests (the file is empty)")
    found = first_line_format(first)
    if found is not None:
        raise ValueError(f"{path}: {found.refusal}")
    unknown = unknown_header(first)
    if unknown:
        raise ValueError(f"{path}:1: {unknown}")
    requests: list[WorkloadRequest] = []
    for number, item in json_lines(path, lines):
        try:
            requests.append(parse_request(item))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
    if not requests:
        raise ValueError(f"{path}: no requests")
    if len({r.id for r in requests}) != len(requests):
        raise ValueError(f"{path}: request ids repeat")
    return requests


def dump_jsonl(requests: list[WorkloadRequest], path: str | Path) -> Path:
    """Write ``requests`` as a workload file (fields at their defaults left out)."""
    defaults = WorkloadRequest("x", 0.0, 1, 1)
    lines = []
    for request in requests:
        row: dict[str, Any] = {"id": request.id}
        for name in _FIELDS:
            owner, default = ((request.meta, DEFAULT_META) if name in _META_KEYS
                              else (request, defaults))
            value = getattr(owner, name)
            if name in _REQUIRED or value != getattr(default, name):
                row[name] = dict(value) if isinstance(value, Mapping) else value
        lines.append(json.dumps(row))
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path
