"""Does edf order against fcfs on the real engine as the simulator says? Issue 50's edf mix
(half TTFT 300 ms + TPOT 50 ms, half only a deadline 15 s after arrival), 200 requests, at
the rate where the simulator (profile fitted here, on the same requests all at t=0) gives
fcfs about 50% attainment; one real run per policy, then the simulator on the same workload.

    python benchmarks/lab/edf_real_order.py --model ../shared/models/stories260K-hf"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_sched_promises import independent_mix  # noqa: E402

from aioserve import AsyncEngine, EngineConfig  # noqa: E402
from aioserve.reports.figures import policy_figures  # noqa: E402
from aioserve.sim.calibrate import calibrate  # noqa: E402
from aioserve.sim.real import replay, sim_config_of  # noqa: E402
from aioserve.sim.simulator import simulate  # noqa: E402

FIGURES = ("slo_attainment", "mean_ttft_s", "mean_e2e_s")


def at_zero(n: int) -> list:
    """The mix's requests all at t=0 (the calibration's and capacity's workload)."""
    return [replace(w, arrival_s=0.0) for w in independent_mix(n, 1.0)]


async def main(args: argparse.Namespace) -> None:
    print(f"load average before {os.getloadavg()}")
    config = EngineConfig(model=args.model, max_num_seqs=8, num_kv_blocks=48)
    async with AsyncEngine(config) as engine:
        profile = await calibrate(engine, at_zero(args.n))
        sim_config = sim_config_of(engine, cost_model=profile)
        rate, best = 1.0, 2.0  # the simulated rate where fcfs attains nearest 50%
        for step in range(1, 400):
            candidate = 2.0 * step
            got = policy_figures(await simulate(independent_mix(args.n, candidate), "fcfs",
                                                sim_config))["slo_attainment"]
            if abs(got - 0.5) < best:
                rate, best = candidate, abs(got - 0.5)
            if got < 0.4:
                break
        workload = independent_mix(args.n, rate)
        print(f"rate {rate:g} req/s ({args.n} requests)")
        for policy in ("fcfs", "edf"):
            real = policy_figures(await replay(engine, workload, policy))
            sim = policy_figures(await simulate(workload, policy, sim_config))
            print(f"{policy:5s} " + "  ".join(f"{k} real {real[k]:.3f} sim {sim[k]:.3f}"
                                               for k in FIGURES))
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--n", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
