"""A file workload's options (``FILE:key=value,...``): a window, its clock, its lengths.

In order: the window (``start`` s on the trace's clock, then ``duration`` s and/or the first
``n`` requests; ``window=i`` takes the i-th such window after ``start``), re-zeroed at its
first arrival; lengths times one factor ``len_scale`` (``auto`` with ``max_len``: the factor
that fits the whole file's p99 of prompt + output into ``max_len``, never above 1; so every
window of a file scales alike), then clipped
to ``max_len``: output to ``max_len // 2``, prompt to ``max_len - output``; arrivals scaled to
a mean ``rate`` (req/s over the window) or sped up by ``speed``, or with ``burstiness`` redrawn
as gamma arrivals of that shape at that rate (vLLM bench's ``--burstiness``; order and lengths
kept). With prefix blocks (Mooncake), ``len_scale`` is rounded to ``B/512`` with ``B`` a
multiple of 16 tokens, at least 16: each 512-token block becomes ``B`` tokens (whole 16-token
KV blocks), so requests that share ``k`` leading blocks share their first ``k * B`` prompt
tokens and the prefix cache hits them (the engine's default block size; a larger one hits
``floor(k * B / block_size)`` blocks)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields, replace
from pathlib import Path

from aioserve.workloads.request import MAX_REQUESTS, WorkloadRequest, load_jsonl
from aioserve.workloads.traces import MOONCAKE_BLOCK_TOKENS, detect, read_trace


@dataclass(frozen=True)
class TraceOptions:
    """The options of a file workload (seconds, requests/s, tokens); None: unset."""

    start: float = 0.0
    duration: float | None = None
    n: int | None = None
    window: int = 0
    rate: float | None = None
    speed: float | None = None
    burstiness: float | None = None
    seed: int = 0
    len_scale: float | str | None = None
    max_len: int | None = None


OPTIONS = tuple(f.name for f in fields(TraceOptions))
_INTS = ("n", "window", "seed", "max_len")
#: The KV block size a scaled prefix block is a multiple of (the engine's default).
_KV_BLOCK = 16


def _number(key: str, value: str) -> float | str:
    if key == "len_scale" and value == "auto":
        return value
    top, _, bottom = value.partition("/")
    try:
        number = float(top) / float(bottom) if bottom else float(top)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"workload option {key}: expected a number, got {value!r}") from None
    if key in _INTS and number != int(number) or not number >= 0 or math.isinf(number):
        raise ValueError(f"workload option {key}: expected a {'whole ' * (key in _INTS)}"
                         f"number >= 0, got {value!r}")
    if key == "n" and number > MAX_REQUESTS:
        raise ValueError(f"workload option n: at most {MAX_REQUESTS:,} requests, got {value!r}")
    return int(number) if key in _INTS else number


def parse_options(text: str) -> TraceOptions:
    """``key=value,...`` (``OPTIONS``); ValueError naming the option."""
    found: dict[str, float | str] = {}
    for part in filter(None, text.split(",")):
        key, _, raw = part.partition("=")
        if key not in OPTIONS:
            raise ValueError(f"workload option {key!r}: unknown (known: {', '.join(OPTIONS)})")
        found[key] = _number(key, raw)
    options = TraceOptions(**found)  # type: ignore[arg-type]
    positive = {"duration": options.duration, "n": options.n, "rate": options.rate,
                "speed": options.speed, "burstiness": options.burstiness,
                "len_scale": options.len_scale if options.len_scale != "auto" else None}
    for name, value in positive.items():
        if value is not None and not float(value) > 0:
            raise ValueError(f"workload option {name}: must be > 0")
    if options.rate is not None and options.speed is not None:
        raise ValueError("workload options rate and speed: give one")
    if options.max_len is not None and options.max_len < 2:
        raise ValueError("workload option max_len: must be >= 2")
    if options.len_scale == "auto" and options.max_len is None:
        raise ValueError("workload option len_scale=auto needs max_len")
    return options


def split_spec(spec: str) -> tuple[str, str]:
    """A workload spec's name or path and its options text (after the last ``:``)."""
    head, colon, tail = spec.rpartition(":")
    if colon and "=" in tail or colon and not tail:
        return head, tail
    return spec, ""


def window(requests: list[WorkloadRequest], options: TraceOptions,
           source: str) -> list[WorkloadRequest]:
    """The window the options select, re-zeroed at its first arrival (ValueError if empty)."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    start, span, count = options.start, options.duration, options.n
    if options.window and span is None and count is None:
        raise ValueError("workload option window: needs duration or n")
    if span is not None:
        start += options.window * span
        chosen = [r for r in ordered if start <= r.arrival_s < start + span]
    else:
        chosen = [r for r in ordered if r.arrival_s >= start]
    if count is not None:
        skip = options.window * count if span is None else 0
        chosen = chosen[skip: skip + count]
        if span is None and len(chosen) < count:
            raise ValueError(f"{source}: window {options.window} of {count} requests from "
                             f"{options.start} s: only {len(chosen)} left")
    if not chosen:
        last = ordered[-1].arrival_s if ordered else 0.0
        raise ValueError(f"{source}: the window from {start} s holds no request (the trace "
                         f"has {len(ordered)} over {last:.1f} s)")
    zero = chosen[0].arrival_s
    return [replace(r, arrival_s=round(r.arrival_s - zero, 6)) for r in chosen]


def length_factor(requests: list[WorkloadRequest], options: TraceOptions) -> float:
    """The one factor for every length (``auto``, prefix-block rounding: the module)."""
    given = options.len_scale
    scale = float(given) if given is not None and not isinstance(given, str) else 1.0
    if options.len_scale == "auto" and options.max_len is not None:
        totals = sorted(r.prompt_len + r.output_len for r in requests)
        p99 = totals[min(len(totals) - 1, math.ceil(0.99 * len(totals)) - 1)]
        scale = min(1.0, options.max_len / p99)
    if any(r.prefix_blocks for r in requests):
        tokens = max(_KV_BLOCK, round(MOONCAKE_BLOCK_TOKENS * scale / _KV_BLOCK) * _KV_BLOCK)
        return tokens / MOONCAKE_BLOCK_TOKENS
    return scale


def scale_lengths(requests: list[WorkloadRequest], options: TraceOptions,
                  factor: float) -> list[WorkloadRequest]:
    """Every length times ``factor``, then clipped to ``max_len``."""
    if factor == 1.0 and options.max_len is None:
        return requests
    cap = options.max_len

    def scaled(n: int) -> int:
        return max(1, round(n * factor))

    out = []
    for r in requests:
        output = scaled(r.output_len)
        prompt = scaled(r.prompt_len)
        limit = None if r.max_tokens is None else scaled(r.max_tokens)
        if cap is not None:
            output = min(output, cap // 2)
            prompt = min(prompt, cap - output)
            limit = None if limit is None else min(limit, cap - prompt)
        out.append(replace(
            r, prompt_len=prompt, output_len=output,
            max_tokens=None if limit is None else max(limit, output),
            prefix_len=min(round(r.prefix_len * factor), prompt),
            length_hint=None if r.length_hint is None else scaled(r.length_hint),
            block_tokens=round(r.block_tokens * factor) if r.prefix_blocks else 0))
    return out


def retime(requests: list[WorkloadRequest], options: TraceOptions) -> list[WorkloadRequest]:
    """Arrivals scaled to ``rate`` or by ``speed``, or redrawn with ``burstiness``."""
    times = [r.arrival_s for r in requests]
    span = times[-1] - times[0]
    mean_rate = (len(times) - 1) / span if span > 0 else None
    if options.burstiness is not None:
        rate = options.rate or (mean_rate or 0) * (options.speed or 1.0)
        if not rate:
            raise ValueError("workload option burstiness: needs rate (the window has one "
                             "arrival time)")
        rng = random.Random(options.seed)
        shape = options.burstiness
        t, times = 0.0, []
        for _ in requests:
            times.append(t)
            t += rng.gammavariate(shape, 1 / (rate * shape))
    elif options.rate is not None:
        if mean_rate is None:
            raise ValueError("workload option rate: the window has one arrival time; "
                             "use burstiness=1 for Poisson arrivals")
        times = [t * mean_rate / options.rate for t in times]
    elif options.speed is not None:
        times = [t / options.speed for t in times]
    return [replace(r, arrival_s=round(t, 6)) for r, t in zip(requests, times)]


def load_file(path: str | Path, text: str = "") -> list[WorkloadRequest]:
    """A trace or workload file with options (``text``: ``key=value,...``).

    Raises:
        ValueError: an option (named), a bad row (``FILE:LINE: column 'NAME' ...``), an
            empty window. OSError: the file cannot be read."""
    options = parse_options(text)
    found = detect(path)
    requests = read_trace(path, found) if found is not None else load_jsonl(path)
    if not text:
        return requests
    factor = length_factor(requests, options)
    chosen = window(requests, options, str(path))
    return retime(scale_lengths(chosen, options, factor), options)


def describe(requests: list[WorkloadRequest]) -> str:
    """One line: requests, span, mean rate, prompt and output tokens (median / p99 / max)."""
    def spread(values: list[int]) -> str:
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
        return f"{ordered[len(ordered) // 2]} / {p99} / {ordered[-1]}"

    times = sorted(r.arrival_s for r in requests)
    span = times[-1] - times[0]
    rate = f"{(len(times) - 1) / span:.2f} req/s" if span > 0 else "all at once"
    blocks = {r.block_tokens for r in requests if r.prefix_blocks}
    return (f"{len(requests)} requests over {span:.1f} s ({rate}); prompt tokens median / p99 / "
            f"max {spread([r.prompt_len for r in requests])}, output "
            f"{spread([r.output_len for r in requests])}"
            + (f"; {blocks.pop()} tokens per prefix block" if len(blocks) == 1 else ""))
