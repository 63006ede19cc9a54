"""The production hour (issue 52): the shipped Azure conversation trace (one hour, 19,366
requests) replayed against a live ``aioserve serve``, compressed to ``--duration-s`` (at
least 900 s for the floor), at 0.9x the server's measured capacity, then at 1.5x; both
with ``serve``'s admission limit at its default (``--max-waiting`` sets another, or
``none``). The server's RSS, open files and asyncio tasks are
sampled every ``--sample-s`` seconds; per window (``--window-s``, 300 s by default) it prints
requests sent, completed, refused (429), errors, p99 TTFT of the admitted, RSS, open files,
tasks; then each floor's figures, pass or fail.

The hour keeps its shape: the trace is thinned (a seeded sample, arrival order kept) to the
number of requests the target rate sends over the duration, and its clock is compressed by
3,502 s / duration (a rate past what the trace holds sends all of it, in less time).
Capacity is measured first, and again at the end of the 0.9x phase (a probe:
``--probe-n`` requests of the same mix sent at once, no more in flight than the limit
admits; completed requests per second of the makespan).

    python benchmarks/serving/endurance.py --model ../shared/models/stories260K-hf  # the floor
    python benchmarks/serving/endurance.py --model ... --duration-s 60 --window-s 15  # a try
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import re
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from aioserve.bench.online.serving import run_serving
from aioserve.bench.server_process import ServerProcess
from aioserve.commands.common import positive_float, positive_floats, positive_int
from aioserve.commands.serve import max_waiting_arg
from aioserve.engine.admission import DEFAULT_WAITING_BATCHES, serve_max_waiting
from aioserve.reports.figures import admission_refusals, outcomes
from aioserve.reports.outcome import Outcome
from aioserve.reports.stats import percentile
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import load_workload

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure-llm-2023-conv.csv"
#: The Azure trace's span in seconds (its README).
TRACE_SPAN_S = 3502.0
KEY = "endurance-key"
#: The vocabulary the trace's prompts are drawn from (stories260K has 512 tokens).
VOCAB = 512


def positive_ints(value: str) -> list[int]:
    """An argparse type: a comma list of integers >= 1."""
    return [positive_int(item) for item in value.split(",")]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Sample:
    """One reading of the server process (seconds since the phase started)."""

    t: float
    rss_mib: float
    open_files: int
    tasks: int | None


@dataclass
class Phase:
    """One replay: its outcomes (request order; ``arrival_s`` is when each was sent), the
    requested output length of each by id, and the samples."""

    name: str
    rate: float
    records: list[Outcome] = field(default_factory=list)
    output_len: dict[str, int] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0


def read_process(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) of ``pid`` from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def read_tasks(url: str) -> int | None:
    """The server's ``aioserve:asyncio_tasks`` gauge."""
    request = urllib.request.Request(url + "/metrics",
                                     headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read().decode()
    found = re.search(r"^aioserve:asyncio_tasks (\S+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else None


async def sample(server: ServerProcess, phase: Phase, every_s: float,
                 stop: asyncio.Event) -> None:
    """Read the server every ``every_s`` seconds until ``stop``."""
    start = time.perf_counter()
    while not stop.is_set():
        rss, files = read_process(server.proc.pid)
        tasks = await asyncio.to_thread(read_tasks, server.url)
        phase.samples.append(Sample(time.perf_counter() - start, rss, files, tasks))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def hour(requests: list[WorkloadRequest], rate: float, duration_s: float,
         seed: int) -> list[WorkloadRequest]:
    """The hour thinned to ``rate * duration_s`` requests (seeded, order kept) on a clock
    compressed into ``duration_s``; a trace holding fewer is sent whole, compressed into
    ``len / rate`` seconds (the rate kept, the phase shorter)."""
    wanted = max(1, round(rate * duration_s))
    count = min(len(requests), wanted)
    keep = sorted(random.Random(seed).sample(range(len(requests)), count))
    scale = duration_s * count / wanted / TRACE_SPAN_S
    return [replace(requests[i], arrival_s=requests[i].arrival_s * scale)
            for i in keep]


async def probe(url: str, requests: list[WorkloadRequest], limit: int | None) -> float:
    """Completed requests per second with ``requests`` sent at once (the capacity; their
    ``arrival_s`` unused), at most ``limit`` (the server's ``max_waiting``) in flight, so
    its admission limit refuses none (the batch stays full while ``limit`` >= the batch)."""
    records, wall, _ = await run_serving(url, requests, endpoint="completions", api_key=KEY,
                                         vocab_size=VOCAB, max_concurrency=limit)
    wanted = {r.id: r.output_len for r in requests}
    return sum(complete(r, wanted) for r in records) / wall


async def replay(server: ServerProcess, phase: Phase, requests: list[WorkloadRequest],
                 sample_s: float) -> None:
    """Send ``requests`` at their ``arrival_s`` while sampling the server."""
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(server, phase, sample_s, stop))
    start = time.perf_counter()
    phase.output_len = {r.id: r.output_len for r in requests}
    phase.records, _, _ = await run_serving(server.url, requests, at_arrivals=True,
                                            vocab_size=VOCAB, endpoint="completions",
                                            api_key=KEY)
    phase.wall_s = time.perf_counter() - start
    stop.set()
    await sampler


def refused(record: Outcome) -> bool:
    """Answered 429 by the admission limit (``queue_full``, ``queue_timeout``)."""
    return admission_refusals([record]) == 1


def complete(record: Outcome, output_len: dict[str, int]) -> bool:
    """Finished with every output token its workload request asked for."""
    return record.ok and record.output_tokens == output_len[record.id]


def windows(phase: Phase, window_s: float) -> list[dict[str, float]]:
    """Per window of send time: sent, completed, refused, errors, p99 TTFT of the
    completed (ms), and the last sample's RSS (MiB), open files and tasks."""
    wanted = phase.output_len
    rows = []
    count = max(1, int(max(r.arrival_s for r in phase.records) // window_s) + 1)
    for w in range(count):
        lo, hi = w * window_s, (w + 1) * window_s
        inside = [r for r in phase.records if lo <= r.arrival_s < hi]
        done = [r for r in inside if complete(r, wanted)]
        samples = [s for s in phase.samples if s.t < hi] or phase.samples[:1]
        last = samples[-1]
        rows.append({
            "from_s": lo, "sent": len(inside), "completed": len(done),
            "refused": sum(refused(r) for r in inside),
            "errors": sum(not complete(r, wanted) and not refused(r) for r in inside),
            "p99_ttft_ms": 1000 * (percentile(ttfts(done), 99) or 0.0),
            "rss_mib": last.rss_mib, "open_files": last.open_files,
            "tasks": last.tasks if last.tasks is not None else -1,
        })
    return rows


def report(phase: Phase, window_s: float) -> list[dict[str, float]]:
    rows = windows(phase, window_s)
    print(f"\n{phase.name}: {len(phase.records)} requests at {phase.rate:.2f} req/s over "
          f"{phase.wall_s:.0f} s (load average {load()})")
    print(f"{'from s':>7} {'sent':>6} {'done':>6} {'429':>5} {'errors':>6} "
          f"{'p99 TTFT ms':>11} {'RSS MiB':>8} {'files':>6} {'tasks':>6}")
    for row in rows:
        print(f"{row['from_s']:>7.0f} {row['sent']:>6} {row['completed']:>6} "
              f"{row['refused']:>5} {row['errors']:>6} {row['p99_ttft_ms']:>11.1f} "
              f"{row['rss_mib']:>8.1f} {row['open_files']:>6} {row['tasks']:>6}")
    for record in phase.records:
        if not complete(record, phase.output_len) and not refused(record):
            print(f"  error: {record.error or 'short: ' + str(record.output_tokens)}")
            break
    return rows


def ttfts(records: list[Outcome]) -> list[float]:
    """The TTFTs (s) of ``records`` that have one."""
    return [r.ttft for r in records if r.ttft is not None]


def p99_ttft(phase: Phase, records: list[Outcome]) -> float:
    """p99 TTFT (ms) of the complete ``records`` of ``phase``; NaN when none completed."""
    found = percentile(ttfts([r for r in records if complete(r, phase.output_len)]), 99)
    return float("nan") if found is None else 1000 * found


def verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def floors(phases: list[Phase], capacity: float, end_capacity: float,
           window_s: float) -> None:
    """Each floor of issue 52 this run measures: its figure, pass or fail."""
    print("\nfloors (this run's scale and box; the floor's hour needs >= 900 s on a quiet box)")
    if end_capacity:
        drift = end_capacity / capacity - 1
        print(f"  capacity probes, start {capacity:.2f} / end {end_capacity:.2f} req/s: "
              f"{drift:+.1%} ({'within 10%' if abs(drift) <= 0.1 else 'RERUN: beyond 10%'})")
    base = next((p for p in phases if p.rate <= capacity), None)
    if base is not None:
        rss = [s.rss_mib for s in base.samples]
        first = [s.rss_mib for s in base.samples if s.t <= min(300.0, window_s)]
        quarter = max(1, len(base.records) // 4)
        ordered = sorted(base.records, key=lambda r: r.arrival_s)
        refused_n = sum(refused(r) for r in base.records)
        errors = sum(not complete(r, base.output_len) for r in base.records) - refused_n
        growth = rss[-1] / first[-1]
        drift = p99_ttft(base, ordered[-quarter:]) / p99_ttft(base, ordered[:quarter])
        print(f"  {base.name}:\n"
              f"    errors {errors}, refused {refused_n} (both 0): "
              f"{verdict(errors == 0 and refused_n == 0)}\n"
              f"    RSS end / after the first window {growth:.3f} (<= 1.10): "
              f"{verdict(growth <= 1.10)}\n"
              f"    p99 TTFT last / first quarter {drift:.2f} (<= 1.2): {verdict(drift <= 1.2)}")
    for over in (p for p in phases if p.rate > capacity):
        done = sum(complete(r, over.output_len) for r in over.records)
        refused_n = sum(refused(r) for r in over.records)
        other = len(over.records) - done - refused_n
        rate = done / over.wall_s / capacity
        share = refused_n / len(over.records)
        admitted = p99_ttft(over, over.records)
        reference = p99_ttft(base, base.records) if base else math.nan
        print(f"  {over.name}:\n"
              f"    neither completed nor 429 {other} (0): {verdict(other == 0)}\n"
              f"    completed {rate:.2f}x capacity (>= 0.9): {verdict(rate >= 0.9)}\n"
              f"    refused {share:.1%} (<= 40%): {verdict(share <= 0.4)}\n"
              f"    admitted p99 TTFT {admitted:.0f} ms / {reference:.0f} ms at "
              f"{base.name.split(',')[0] if base else '0.9x'} = {admitted / reference:.2f} "
              f"(<= 2): {verdict(admitted <= 2 * reference)}")


async def run(workload: list[WorkloadRequest], config: SimConfig
              ) -> tuple[int, int, float, float]:
    """(completed, refused, makespan s, p99 TTFT s of the completed) of one simulation."""
    every = outcomes(await simulate(workload, "fcfs", config))
    done = [o for o in every if o.ok]
    ttft = percentile([o.ttft for o in done if o.ttft is not None], 99) or 0.0
    return len(done), admission_refusals(every), max(o.finish_s or 0.0 for o in done), ttft


async def simulated(args: argparse.Namespace, batches: list[int]) -> None:
    """The same hour in the simulator (the engine core's own admission rule, no box noise; a
    flat step cost, ``--step-ms``, near the live server's): per limit of ``batches`` x
    ``--max-num-seqs``, refused at 0.9x, and at 1.5x completed (x capacity), refused share,
    admitted p99 TTFT over its 0.9x value without a limit."""
    requests = load_workload(f"{args.trace}:len_scale=auto,max_len=512")
    config = SimConfig(slots=args.max_num_seqs, step_ms=args.step_ms, prefill_ms_per_token=0.02,
                       max_model_len=512)
    probe = [replace(r, arrival_s=0.0)
             for r in hour(requests, 8 * args.max_num_seqs / args.duration_s, args.duration_s, 1)]
    done, _, span, _ = await run(probe, config)
    capacity = done / span
    low, high = (hour(requests, f * capacity, args.duration_s, args.seed) for f in (0.9, 1.5))
    _, _, _, reference = await run(low, config)
    print(f"slots {args.max_num_seqs}, step {args.step_ms:g} ms: capacity {capacity:.2f} req/s; "
          f"0.9x: {len(low)} requests, p99 TTFT {reference:.2f} s without a limit; "
          f"1.5x: {len(high)} requests")
    print("batches  max_waiting  refused@0.9x  completed@1.5x  refused@1.5x  p99 TTFT ratio")
    for count in batches:
        limited = replace(config, max_waiting=count * args.max_num_seqs)
        _, refused_low, _, _ = await run(low, limited)
        done, refused, span, ttft = await run(high, limited)
        print(f"{count:>7}  {count * args.max_num_seqs:>11}  {refused_low:>12}  "
              f"{done / span / capacity:>13.2f}x  {refused / len(high):>12.1%}  "
              f"{ttft / reference:>14.2f}")



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="the served model (required unless --simulate)")
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--duration-s", type=positive_float, default=900.0,
                        help="the hour compressed into this many seconds (>= 900 for the floor)")
    parser.add_argument("--window-s", type=positive_float, default=300.0,
                        help="rows of the report")
    parser.add_argument("--sample-s", type=positive_float, default=5.0, help="server readings")
    parser.add_argument("--max-num-seqs", type=positive_int, default=8)
    parser.add_argument("--max-model-len", type=positive_int, default=512)
    parser.add_argument("--max-waiting", type=max_waiting_arg, default=None,
                        help="serve's --max-waiting in every phase, N or 'none' (default: "
                        f"serve's own, {DEFAULT_WAITING_BATCHES} x --max-num-seqs)")
    parser.add_argument("--probe-n", type=positive_int, default=320,
                        help="requests of a capacity probe (a small one varies: its few "
                        "long requests arrive in any order)")
    parser.add_argument("--loads", type=positive_floats, default=[0.9, 1.5],
                        help="multiples of capacity (comma list)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simulate", type=positive_ints, default=None, metavar="BATCHES",
                        help="no server: simulate the hour with max_waiting at each of these "
                        "numbers of batches (e.g. 4,6,8) to choose a limit")
    parser.add_argument("--step-ms", type=positive_float, default=14.0,
                        help="--simulate's flat step cost")
    args = parser.parse_args()
    if args.simulate is not None:
        asyncio.run(simulated(args, args.simulate))
        return
    if args.model is None:
        parser.error("--model is required (or --simulate BATCHES)")
    for flag in ("duration_s", "window_s", "sample_s"):  # refused before a server starts
        if math.isinf(getattr(args, flag)):
            parser.error(f"--{flag.replace('_', '-')}: must be finite")
    limit = serve_max_waiting(args.max_waiting, args.max_num_seqs)
    extra = [] if args.max_waiting is None else ["--max-waiting", str(args.max_waiting)]
    probe_limit = limit  # in flight: never one the limit refuses (below the batch: less)
    note = f"--max-waiting {limit}" + (" (serve's default)" if args.max_waiting is None else "")
    spec = f"{args.trace}:len_scale=auto,max_len={args.max_model_len}"
    try:
        requests = load_workload(spec)
    except ValueError as exc:
        parser.error(f"--trace: {exc}")
    print(f"load average before: {load()}; trace {len(requests)} requests; the box may be "
          "shared: figures are this run's")
    common = ["--model", args.model, "--max-num-seqs", str(args.max_num_seqs),
              "--max-model-len", str(args.max_model_len), "--log-level", "warning",
              "--stats-log-interval", "0"]
    phases: list[Phase] = []
    capacity = end_capacity = 0.0
    for load_factor in args.loads:
        limited = load_factor > 1
        server = ServerProcess(common + extra, env={"AIOSERVE_API_KEY": KEY})
        try:
            server.wait_ready()
            probe_set = hour(requests, args.probe_n / args.duration_s, args.duration_s,
                             args.seed + 1)
            if not capacity:
                capacity = asyncio.run(probe(server.url, probe_set, probe_limit))
                print(f"capacity (probe of {len(probe_set)}, at most {probe_limit or 'all'} in "
                      f"flight): {capacity:.2f} req/s")
            rate = load_factor * capacity
            phase = Phase(f"{load_factor:g}x capacity, {note}", rate)
            if rate * args.duration_s > len(requests):
                print(f"{phase.name}: the trace's {len(requests)} requests at {rate:.2f} "
                      f"req/s last {len(requests) / rate:.0f} s, not {args.duration_s:g} s")
            asyncio.run(replay(server, phase, hour(requests, rate, args.duration_s,
                                                   args.seed), args.sample_s))
            phases.append(phase)
            if not limited:
                end_capacity = asyncio.run(probe(server.url, probe_set, probe_limit))
                print(f"capacity at the end: {end_capacity:.2f} req/s "
                      f"({end_capacity / capacity - 1:+.1%}; rerun beyond 10%)")
        finally:
            server.stop()
        report(phase, args.window_s)
    floors(phases, capacity, end_capacity, args.window_s)
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
