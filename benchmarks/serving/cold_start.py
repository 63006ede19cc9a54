"""How long does the server take to start? Seconds from ``aioserve serve`` to ``GET /health``
200, warm (kernels built) and fresh (an empty ``TORCH_EXTENSIONS_DIR``), for this checkout and
``--baseline-tree``, starts alternating.

Prints every start, the medians, the floors (warm <= 3 s, fresh <= 10 s) and the server's own
``ready in`` line.

    python3 benchmarks/serving/cold_start.py --model ../shared/models/stories260K-hf \\
        [--baseline-tree /tmp/base] [--runs 3] [--no-baseline-fresh]"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's aioserve

from aioserve.bench.server_process import ServerProcess, source_tree  # noqa: E402

HERE = Path(__file__).resolve().parents[2]


def end_builders(cache: Path, wait_s: float = 60.0) -> None:
    """Kill the background kernel build under ``cache`` (its lock names its session leader)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        folders = list(cache.glob("aioserve_cpu_*"))
        if folders and any((f / name).exists() for f in folders
                           for name in ("READY", "FAILED")):
            return
        for lock in cache.glob("*/aioserve.lock"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.killpg(int(lock.read_text().split()[0]), signal.SIGKILL)
                return
        time.sleep(0.05)


def start_once(model: str, tree: Path, cache: Path | None) -> tuple[float, str]:
    """Seconds to ready, and the server's ``ready in`` log line (if it prints one)."""
    env = {"TORCH_EXTENSIONS_DIR": str(cache)} if cache is not None else {}
    server = ServerProcess(["--model", model, "--log-level", "info"], tree, env)
    try:
        seconds = server.wait_ready(timeout=600)
        for _ in range(50):  # the line follows "listening on" at once
            lines = server.log_lines("ready in")
            if lines or tree != HERE:
                break
            time.sleep(0.02)
        return seconds, (lines[0].split(": ", 1)[-1] if lines else "")
    finally:
        server.stop()
        if cache is not None and tree == HERE:
            end_builders(cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model",
                        default=str(HERE.parent / "shared" / "models" / "stories260K-hf"))
    parser.add_argument("--runs", type=int, default=3, help="starts per kind and code")
    parser.add_argument("--baseline-tree", default=None, help="the code before")
    parser.add_argument("--no-baseline-fresh", action="store_true",
                        help="skip the baseline's fresh starts (each compiles: 20-60 s)")
    args = parser.parse_args()
    model = str(Path(args.model).resolve())
    trees = {"this": HERE}
    baseline = source_tree(args.baseline_tree)
    if baseline is not None:
        trees["baseline"] = baseline
    print(f"load average before: {os.getloadavg()}", flush=True)
    for tree in trees.values():  # warm each tree's own build first (not timed)
        start_once(model, tree, None)
    results: dict[tuple[str, str], list[float]] = {}
    account = []
    for run in range(args.runs):
        for name, tree in trees.items():
            for kind in ("warm", "fresh"):
                if kind == "fresh" and name == "baseline" and (args.no_baseline_fresh
                                                               or run > 0):
                    continue
                with tempfile.TemporaryDirectory(prefix="aioserve-kernels-") as fresh:
                    cache = Path(fresh) if kind == "fresh" else None
                    seconds, line = start_once(model, tree, cache)
                results.setdefault((name, kind), []).append(seconds)
                if name == "this" and line:
                    account.append(f"{kind}: {line}")
                print(f"# run {run} {name:8} {kind:5} ready in {seconds:6.2f} s", flush=True)
    print(f"load average after: {os.getloadavg()}")
    print(f"{'code':9} {'start':6} {'median s':>9}   runs")
    for (name, kind), values in results.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:9} {kind:6} {statistics.median(values):9.2f}   {runs}")
    warm = statistics.median(results[("this", "warm")])
    fresh = statistics.median(results[("this", "fresh")])
    print(f"floor warm <= 3 s   {'PASS' if warm <= 3 else 'FAIL'} ({warm:.2f} s)")
    print(f"floor fresh <= 10 s {'PASS' if fresh <= 10 else 'FAIL'} ({fresh:.2f} s)")
    print("this checkout's own account (operator log):")
    for line in account:
        print("  " + line)


if __name__ == "__main__":
    main()
