"""Simulator workloads: the article's two, JSON Lines files, and a bursty Poisson stream.

The article is "continuous batching: a car-pool whose empty seats are refilled at every
stop". Its example has four requests of 100, 20, 50 and 200 decode steps arriving
together and a fifth of 30 arriving just after the batch starts; its mix has 100
requests at t=0 alternating 20 and 200 tokens.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from aioserve.sim.runner import NS_PER_S

#: Prompt length of the article's requests (it counts decode steps only; with the
#: default prefill cost of 0 the prompt length changes no timing, only KV use).
ARTICLE_PROMPT_LEN = 16


@dataclass(frozen=True)
class WorkloadRequest:
    """One simulated request.

    Attributes:
        id: request id.
        arrival_s: arrival time in seconds.
        prompt_len: prompt tokens (>= 1).
        output_len: output tokens it generates, the last one EOS (>= 1).
        length_hint: predicted output tokens given to the scheduler (None: the true
            ``output_len``).
        after_start: on a tie with a step boundary, arrive just after that step was
            scheduled (the article's request E, "just after the batch starts").
        prefix_group: requests of one group share their first ``prefix_len`` prompt
            tokens (None: the whole prompt is the request's own).
        prefix_len: tokens of the shared prefix (<= ``prompt_len``).
    """

    id: str
    arrival_s: float
    prompt_len: int
    output_len: int
    length_hint: int | None = None
    after_start: bool = False
    prefix_group: str | None = None
    prefix_len: int = 0

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1 or self.arrival_s < 0:
            raise ValueError(
                f"workload request {self.id!r}: prompt_len and output_len must be >= 1 "
                "and arrival_s >= 0"
            )
        if not 0 <= self.prefix_len <= self.prompt_len:
            raise ValueError(f"workload request {self.id!r}: prefix_len must be 0..prompt_len")

    def prompt_token_ids(self, vocab_size: int, low_id: int) -> list[int]:
        """The prompt: its group's prefix, then tokens of its own (ids in
        ``[low_id, vocab_size)``, drawn from the group name and the request id)."""
        shared = self.prefix_len if self.prefix_group is not None else 0
        head = random.Random(f"prefix:{self.prefix_group}")
        own = random.Random(f"request:{self.id}")
        return [head.randrange(low_id, vocab_size) for _ in range(shared)] + [
            own.randrange(low_id, vocab_size) for _ in range(self.prompt_len - shared)
        ]

    @property
    def arrival_ns(self) -> int:
        """Arrival time in integer nanoseconds (the simulator's clock unit)."""
        return round(self.arrival_s * NS_PER_S)


def article_example() -> list[WorkloadRequest]:
    """A=100, B=20, C=50, D=200 decode steps at t=0; E=30 just after the batch starts."""
    lengths = {"A": 100, "B": 20, "C": 50, "D": 200}
    requests = [WorkloadRequest(k, 0.0, ARTICLE_PROMPT_LEN, n) for k, n in lengths.items()]
    return [*requests, WorkloadRequest("E", 0.0, ARTICLE_PROMPT_LEN, 30, after_start=True)]


def article_mix(count: int = 100) -> list[WorkloadRequest]:
    """``count`` requests at t=0 alternating 20 and 200 tokens (short, long, short, …)."""
    return [
        WorkloadRequest(f"r{i:03d}", 0.0, ARTICLE_PROMPT_LEN, 20 if i % 2 == 0 else 200)
        for i in range(count)
    ]


def poisson(
    n: int = 200, rate: float = 1.0, burst: float = 4.0, seed: int = 0
) -> list[WorkloadRequest]:
    """A bursty Poisson stream: bursts arrive as a Poisson process, each burst holds a
    geometric number of requests (mean ``burst``) arriving together, so requests arrive
    at ``rate`` per second on average. 70 % are short (8–64 output tokens), 30 % long
    (128–512); prompts are 16–256 tokens. Deterministic for a ``seed``.

    Raises:
        ValueError: n < 1, rate <= 0 or burst < 1.
    """
    if n < 1 or rate <= 0 or burst < 1:
        raise ValueError("poisson workload needs n >= 1, rate > 0 and burst >= 1")
    rng = random.Random(seed)
    requests: list[WorkloadRequest] = []
    t = 0.0
    while len(requests) < n:
        t += rng.expovariate(rate / burst)
        size = 1
        while rng.random() > 1 / burst:
            size += 1
        for _ in range(min(size, n - len(requests))):
            out = rng.randint(8, 64) if rng.random() < 0.7 else rng.randint(128, 512)
            requests.append(
                WorkloadRequest(f"p{len(requests):04d}", round(t, 6), rng.randint(16, 256), out)
            )
    return requests


def load_jsonl(path: str | Path) -> list[WorkloadRequest]:
    """Read a workload file: one JSON object per line with ``id``, ``arrival_s``,
    ``prompt_len``, ``output_len`` and optionally ``length_hint``, ``after_start``,
    ``prefix_group`` and ``prefix_len``.

    Raises:
        ValueError: a line is not such an object, or an id repeats.
        OSError: the file cannot be read.
    """
    requests: list[WorkloadRequest] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            requests.append(
                WorkloadRequest(
                    str(item["id"]),
                    float(item["arrival_s"]),
                    int(item["prompt_len"]),
                    int(item["output_len"]),
                    item.get("length_hint"),
                    bool(item.get("after_start", False)),
                    item.get("prefix_group"),
                    int(item.get("prefix_len", 0)),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a workload request ({exc})") from exc
    if len({r.id for r in requests}) != len(requests):
        raise ValueError(f"{path}: request ids repeat")
    return requests


def load_workload(spec: str) -> list[WorkloadRequest]:
    """``article-example``, ``article-mix``, ``poisson[:n=..,rate=..,burst=..,seed=..]``
    or a path to a JSON Lines file.

    Raises:
        ValueError: an unknown name, a bad poisson option or a bad file.
    """
    if spec == "article-example":
        return article_example()
    if spec == "article-mix":
        return article_mix()
    if spec == "poisson" or spec.startswith("poisson:"):
        options: dict[str, float] = {}
        for part in filter(None, spec.partition(":")[2].split(",")):
            key, _, value = part.partition("=")
            if key not in ("n", "rate", "burst", "seed"):
                raise ValueError(f"poisson workload: unknown option {key!r} (n, rate, burst, seed)")
            options[key] = float(value)
        return poisson(
            n=int(options.get("n", 200)),
            rate=options.get("rate", 1.0),
            burst=options.get("burst", 4.0),
            seed=int(options.get("seed", 0)),
        )
    if not Path(spec).exists():
        raise ValueError(
            f"workload {spec!r}: not article-example, article-mix, poisson:... or a file"
        )
    return load_jsonl(spec)
