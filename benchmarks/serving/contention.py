"""Does the engine keep its speed on a busy machine, and which thread count is best there? One
workload, quiet and with K busy co-tenants, for the default thread count and each fixed count,
in one run.

One ``aioserve serve`` per setting, 32 streamed requests x 64 tokens to each in turn, settings
rotating per round. Prints output tokens/s and ITL p99 per setting and load, medians, and the
floors' ratios: default / best fixed count (loaded, >= 0.8) and default / ``--baseline-tree``'s
default (quiet, >= 0.95).

    python3 benchmarks/serving/contention.py --model ../shared/models/stories260K-hf \\
        [--baseline-tree /tmp/base] [--rounds 3] [--cotenants K] [--json]"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's aioserve

from aioserve.bench.cotenants import CoTenants  # noqa: E402
from aioserve.bench.online.serving import run_serving  # noqa: E402
from aioserve.bench.server_process import ServerProcess, source_tree  # noqa: E402
from aioserve.reports.stats import percentile  # noqa: E402
from aioserve.runners.cpu.threads.cpu_budget import usable_cpus  # noqa: E402
from aioserve.workloads.request import WorkloadRequest  # noqa: E402
from aioserve.workloads.synthetic import random_requests  # noqa: E402

LOADS = ("quiet", "loaded")


def settings(cpus: int, baseline: Path | None) -> dict[str, tuple[Path | None, dict, list]]:
    """name -> (source tree, environment, extra serve options)."""
    here = Path(__file__).resolve().parents[2]
    out: dict[str, tuple[Path | None, dict, list]] = {
        "default": (here, {"AIOSERVE_NUM_THREADS": None}, [])}
    for n in range(1, cpus + 1):
        out[f"fixed-{n}"] = (here, {"AIOSERVE_NUM_THREADS": str(n)}, [])
    if baseline is not None:
        out["today"] = (baseline, {"AIOSERVE_NUM_THREADS": None}, [])
    else:
        out["today"] = (here, {"AIOSERVE_NUM_THREADS": str(os.cpu_count() or 1)},
                        ["--forward", "transformers"])
    return out


async def measure(url: str, requests: list[WorkloadRequest]) -> dict[str, float]:
    """One pass of the workload: output tokens/s and ITL p99 (ms)."""
    records, duration, _ = await run_serving(url, requests, endpoint="completions")
    bad = [r.error for r in records if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed: {bad[0]}")
    gaps = [gap for r in records for gap in r.itl]
    return {"tokens_per_s": sum(r.output_tokens for r in records) / duration,
            "itl_p99_ms": 1000 * percentile(gaps, 99), "seconds": duration}


def threads_now(url: str) -> float | None:
    """The server's ``aioserve:cpu_threads`` gauge."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("aioserve:cpu_threads "):
                return float(line.split()[-1])
    return None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cpus = usable_cpus()
    k = args.cotenants if args.cotenants is not None else cpus
    model = str(Path(args.model).resolve())
    requests = random_requests(args.num_requests, (args.input_len, args.input_len),
                               (args.output_len, args.output_len), vocab_size=args.vocab_size,
                               seed=0)
    chosen = settings(cpus, source_tree(args.baseline_tree))
    servers: dict[str, ServerProcess] = {}
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        name: {load: [] for load in LOADS} for name in chosen}
    load_avg = [os.getloadavg()]
    try:
        for name, (tree, env, extra) in chosen.items():
            servers[name] = ServerProcess(
                ["--model", model, "--max-num-seqs", str(args.num_requests), "--log-level",
                 "info", "--stats-log-interval", "0", *extra], tree, env)
        for name, server in servers.items():
            ready = server.wait_ready()
            await measure(server.url, requests[:4])  # warm-up
            print(f"# {name}: ready in {ready:.1f} s", file=sys.stderr, flush=True)
        names = list(chosen)
        cotenants = CoTenants(k)
        for round_ in range(args.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for load in LOADS:
                if load == "loaded":
                    cotenants.start()
                    time.sleep(1.0)
                try:
                    for name in order:
                        result = await measure(servers[name].url, requests)
                        result["threads_after"] = threads_now(servers[name].url) or 0.0
                        results[name][load].append(result)
                        print(f"# round {round_} {load:6} {name:9} "
                              f"{result['tokens_per_s']:8.1f} tok/s  ITL p99 "
                              f"{result['itl_p99_ms']:6.1f} ms  threads after "
                              f"{result['threads_after']:.0f}", file=sys.stderr, flush=True)
                finally:
                    cotenants.stop()
            load_avg.append(os.getloadavg())
        moves = servers["default"].log_lines("CPU threads")
    finally:
        for server in servers.values():
            server.stop()
    return report(results, cpus, k, load_avg, moves, args)


def report(results: dict[str, dict[str, list[dict[str, float]]]], cpus: int, k: int,
           load_avg: list[tuple[float, float, float]], moves: list[str],
           args: argparse.Namespace) -> dict[str, Any]:
    """Medians, ratios and floors."""
    def med(name: str, load: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name][load])

    fixed = [n for n in results if n.startswith("fixed-")]
    best = {load: max(fixed, key=lambda n, load=load: med(n, load, "tokens_per_s"))
            for load in LOADS}
    ratios = {
        "default_vs_best_fixed_loaded": med("default", "loaded", "tokens_per_s")
        / med(best["loaded"], "loaded", "tokens_per_s"),
        "default_vs_today_quiet": med("default", "quiet", "tokens_per_s")
        / med("today", "quiet", "tokens_per_s"),
        "default_vs_best_fixed_quiet": med("default", "quiet", "tokens_per_s")
        / med(best["quiet"], "quiet", "tokens_per_s"),
        "default_vs_today_loaded": med("default", "loaded", "tokens_per_s")
        / med("today", "loaded", "tokens_per_s"),
    }
    return {
        "workload": {"model": args.model, "requests": args.num_requests,
                     "input_len": args.input_len, "output_len": args.output_len,
                     "rounds": args.rounds, "usable_cpus": cpus, "cotenants": k,
                     "baseline_tree": args.baseline_tree},
        "load_average_1_5_15": [list(a) for a in load_avg],
        "results": results,
        "median": {n: {load: {key: med(n, load, key) for key in ("tokens_per_s", "itl_p99_ms")}
                       for load in LOADS} for n in results},
        "best_fixed": best, "ratios": ratios,
        "floors": {"default_vs_best_fixed_loaded >= 0.8":
                   ratios["default_vs_best_fixed_loaded"] >= 0.8,
                   "default_vs_today_quiet >= 0.95": ratios["default_vs_today_quiet"] >= 0.95},
        "default_thread_moves": moves,
    }


def print_table(out: dict[str, Any]) -> None:
    w = out["workload"]
    print(f"{w['requests']} requests x {w['output_len']} greedy tokens (prompt "
          f"{w['input_len']}), {w['usable_cpus']} usable CPUs, {w['cotenants']} co-tenants "
          f"when loaded, {w['rounds']} rounds; load average (1/5/15 min) before: "
          f"{out['load_average_1_5_15'][0]}, after each round: {out['load_average_1_5_15'][1:]}")
    print(f"{'setting':10} {'quiet tok/s':>12} {'loaded tok/s':>13} {'ITL p99 quiet':>14} "
          f"{'ITL p99 loaded':>15}   runs quiet | loaded (tok/s)")
    for name, by_load in out["median"].items():
        runs = " | ".join(", ".join(f"{r['tokens_per_s']:.0f}" for r in out["results"][name][ld])
                          for ld in LOADS)
        print(f"{name:10} {by_load['quiet']['tokens_per_s']:12.1f} "
              f"{by_load['loaded']['tokens_per_s']:13.1f} "
              f"{by_load['quiet']['itl_p99_ms']:11.1f} ms "
              f"{by_load['loaded']['itl_p99_ms']:12.1f} ms"
              f"   {runs}")
    for name, value in out["ratios"].items():
        print(f"{name:32} {value:6.2f}x")
    for floor, ok in out["floors"].items():
        print(f"floor {floor:38} {'PASS' if ok else 'FAIL'}")
    print(f"default's thread moves ({len(out['default_thread_moves'])}):")
    for line in out["default_thread_moves"][-12:]:
        print("  " + line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(Path(__file__).resolve().parents[3]
                                               / "shared" / "models" / "stories260K-hf"))
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cotenants", type=int, default=None,
                        help="busy processes when loaded (default: the usable CPUs)")
    parser.add_argument("--baseline-tree", default=None,
                        help="source tree of today's code (default: emulated, see above)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print_table(out)


if __name__ == "__main__":
    main()
