"""Which default admission limit (issue 52)? The endurance run's hour (``endurance.py``: the
Azure conversation trace thinned to a multiple of capacity and compressed into
``--duration-s``) simulated at 0.9x and 1.5x capacity with ``max_waiting`` at each number
of batches of ``--slots``; prints, per limit, what the floors look at: requests refused at
0.9x, and at 1.5x the completed rate (x capacity), the refused share and the admitted p99
TTFT over its value at 0.9x without a limit. The simulator runs the engine core's own
admission rule, so the figures are noise-free; the step cost is the simulator's flat one
(``--step-ms``, chosen so that capacity is near the live server's), not a calibrated one.

    python benchmarks/serving/admission_sim.py --slots 8 --duration-s 900 --batches 4,6,8
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # endurance.py's hour

from endurance import TRACE, hour  # noqa: E402

from aioserve.commands.common import positive_float, positive_int  # noqa: E402
from aioserve.reports.figures import admission_refusals, outcomes  # noqa: E402
from aioserve.reports.stats import percentile  # noqa: E402
from aioserve.sim.simulator import SimConfig, simulate  # noqa: E402
from aioserve.workloads.request import WorkloadRequest  # noqa: E402
from aioserve.workloads.scenarios import load_workload  # noqa: E402


async def run(workload: list[WorkloadRequest], config: SimConfig
              ) -> tuple[int, int, float, float]:
    """(completed, refused, makespan s, p99 TTFT s of the completed) of one simulation."""
    every = outcomes(await simulate(workload, "fcfs", config))
    done = [o for o in every if o.ok]
    ttft = percentile([o.ttft for o in done if o.ttft is not None], 99) or 0.0
    return len(done), admission_refusals(every), max(o.finish_s or 0.0 for o in done), ttft


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--slots", type=positive_int, default=8)
    parser.add_argument("--duration-s", type=positive_float, default=900.0)
    parser.add_argument("--step-ms", type=positive_float, default=14.0)
    parser.add_argument("--batches", default="4,6,8", help="limits to try, in batches")
    parser.add_argument("--seed", type=int, default=0, help="the thinning's seed")
    args = parser.parse_args()
    requests = load_workload(f"{args.trace}:len_scale=auto,max_len=512")
    config = SimConfig(slots=args.slots, step_ms=args.step_ms, prefill_ms_per_token=0.02,
                       max_model_len=512)
    probe = [replace(r, arrival_s=0.0)
             for r in hour(requests, 8 * args.slots / args.duration_s, args.duration_s, 1)]
    done, _, span, _ = await run(probe, config)
    capacity = done / span
    low, high = (hour(requests, f * capacity, args.duration_s, args.seed) for f in (0.9, 1.5))
    _, _, _, reference = await run(low, config)
    print(f"slots {args.slots}, step {args.step_ms:g} ms: capacity {capacity:.2f} req/s; "
          f"0.9x: {len(low)} requests, p99 TTFT {reference:.2f} s without a limit; "
          f"1.5x: {len(high)} requests")
    print("batches  max_waiting  refused@0.9x  completed@1.5x  refused@1.5x  p99 TTFT ratio")
    for batches in (int(b) for b in args.batches.split(",")):
        limited = replace(config, max_waiting=batches * args.slots)
        _, refused_low, _, _ = await run(low, limited)
        done, refused, span, ttft = await run(high, limited)
        print(f"{batches:>7}  {batches * args.slots:>11}  {refused_low:>12}  "
              f"{done / span / capacity:>13.2f}x  {refused / len(high):>12.1%}  "
              f"{ttft / reference:>14.2f}")


if __name__ == "__main__":
    asyncio.run(main())
