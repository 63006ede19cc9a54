"""The scheduler lab's floors, in the simulator (calibrated) and on the real engine:

* vtc: a light tenant sending 1/10 of the load keeps its TTFT within 2x of running
  alone while a heavy tenant overloads the server; Jain's index of the service of two
  backlogged tenants >= 0.9 (fcfs printed beside);
* priority: under overload, with 10% of requests high-priority, their p99 TTFT within
  2x of their TTFT on an idle server; the low-priority requests' longest queue wait with
  their share of admissions (``low_share``) printed;
* edf: SLO attainment at least 20 points above fcfs at the load where fcfs attains 50%.

Loads are set from the calibrated step cost (the engine's capacity in requests/s at full
batches), so the same script fits any machine. Real figures are medians of
``--repeats`` runs. Quote it on a quiet machine (the load average is printed).

    python3 benchmarks/policy_floors.py --model ../shared/models/stories260K-hf --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from collections.abc import Callable
from typing import Any

from aioserve import AsyncEngine, EngineConfig
from aioserve.commands.common import add_forward_option
from aioserve.sim.calibrate import calibrate
from aioserve.sim.real import replay, sim_config_of
from aioserve.sim.reports.figures import policy_figures
from aioserve.sim.scenarios import priority_mix, slo_mix, two_tenants
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.sim.step_cost import StepCostModel
from aioserve.sim.workloads import WorkloadRequest

MEAN_OUTPUT = 72  # tokens: the scenarios' outputs are uniform in 16-128


def capacity(model: StepCostModel, slots: int, prompt: int = 40) -> float:
    """Requests/s the engine finishes at full batches of decoding requests."""
    step_ms = model.cost_ms(slots, prompt * slots / MEAN_OUTPUT,
                            slots * (prompt + MEAN_OUTPUT // 2))
    return slots / (step_ms / 1e3) / MEAN_OUTPUT


class Runner:
    """Runs one workload under one policy in the simulator and on the engine."""

    def __init__(self, engine: AsyncEngine, config: SimConfig, repeats: int) -> None:
        self.engine, self.config, self.repeats = engine, config, repeats

    async def both(self, workload: list[WorkloadRequest], policy: str,
                   figure: Callable[[dict[str, Any]], float | None],
                   params: dict[str, Any] | None = None) -> tuple[float, float]:
        """(simulated, median real) of ``figure`` of the run's figures."""
        sim = figure(policy_figures(await simulate(workload, policy, self.config,
                                                   scheduler_params=params)))
        real = []
        for _ in range(self.repeats):
            result = await replay(self.engine, workload, policy, params)
            real.append(figure(policy_figures(result)))
        values = [v for v in real if v is not None]
        return (sim if sim is not None else float("nan"),
                statistics.median(values) if values else float("nan"))


def _tenant_ttft(name: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda f: f["tenants"].get(name, {}).get("mean_ttft_s")


def _priority_p99(level: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda f: f["priorities"].get(level, {}).get("p99_ttft_s")


def _low_max_wait(f: dict[str, Any]) -> float | None:
    return f["max_wait_s"]


async def main(args: argparse.Namespace) -> None:
    config = EngineConfig(model=args.model, max_num_seqs=args.slots,
                          num_kv_blocks=args.kv_blocks, forward=args.forward)
    print(f"load average {os.getloadavg()[0]:.2f}")
    async with AsyncEngine(config) as engine:
        model = await calibrate(engine, rounds=2)
        cap = capacity(model, args.slots)
        print(f"capacity at full batches: {cap:.1f} requests/s "
              f"(step {model.cost_ms(args.slots, 0, args.slots * 76):.2f} ms)")
        run = Runner(engine, sim_config_of(engine, cost_model=model), args.repeats)
        n = args.requests

        heavy = two_tenants(n=n, rate=1.6 * cap, light=0.1, seed=21)
        light_only = [w for w in heavy if w.meta.tenant == "light"]
        alone = await run.both(light_only, "fcfs", _tenant_ttft("light"))
        for policy in ("fcfs", "vtc"):
            sim, real = await run.both(heavy, policy, _tenant_ttft("light"))
            print(f"vtc floor | {policy:>5}: light tenant mean TTFT sim {sim:.3f} s "
                  f"({sim / alone[0]:.2f}x alone), real {real:.3f} s ({real / alone[1]:.2f}x "
                  f"alone {alone[1]:.3f} s)  [floor: vtc <= 2x]")
        both_busy = two_tenants(n=n, rate=2.5 * cap, light=0.4, seed=22)
        for policy in ("fcfs", "vtc"):
            sim, real = await run.both(both_busy, policy, lambda f: f["jain_index"])
            print(f"vtc floor | {policy:>5}: Jain's index, backlogged tenants sim {sim:.3f}, "
                  f"real {real:.3f}  [floor: vtc >= 0.9]")

        mix = priority_mix(n=n, rate=1.5 * cap, high=0.1, seed=23)
        high = [w for w in mix if w.meta.priority == 0]
        idle = await run.both(high, "priority", _priority_p99("0"))
        for policy in ("fcfs", "priority"):
            sim, real = await run.both(mix, policy, _priority_p99("0"))
            print(f"priority floor | {policy:>8}: high-priority p99 TTFT sim {sim:.3f} s "
                  f"({sim / idle[0]:.2f}x idle), real {real:.3f} s ({real / idle[1]:.2f}x idle "
                  f"{idle[1]:.3f} s)  [floor: priority <= 2x]")
        params = {"low_share": args.low_share}
        sim, real = await run.both(mix, "priority", _low_max_wait, params)
        print(f"priority floor | longest queue wait with low_share={args.low_share}: sim "
              f"{sim:.3f} s, real {real:.3f} s  [no class starves]")

        rate = await _half_attainment_rate(run.config, n, cap, args.tight_ms)
        slos = slo_mix(n=n, rate=rate, tight_ms=args.tight_ms, loose_ms=10 * args.tight_ms,
                       seed=24)
        for policy in ("fcfs", "edf"):
            sim, real = await run.both(slos, policy, lambda f: f["slo_attainment"])
            print(f"edf floor | {policy:>4} at {rate:.1f} req/s: SLO attainment sim "
                  f"{100 * sim:.1f}%, real {100 * real:.1f}%  [floor: edf >= fcfs + 20 points]")
    print(f"load average {os.getloadavg()[0]:.2f}")


async def _half_attainment_rate(config: SimConfig, n: int, cap: float,
                                tight_ms: float) -> float:
    """The arrival rate at which fcfs attains about 50% in the simulator (bisection)."""
    low, high = 0.3 * cap, 3.0 * cap
    for _ in range(12):
        rate = (low + high) / 2
        workload = slo_mix(n=n, rate=rate, tight_ms=tight_ms, loose_ms=10 * tight_ms, seed=24)
        attained = policy_figures(await simulate(workload, "fcfs", config))["slo_attainment"]
        low, high = (rate, high) if attained > 0.5 else (low, rate)
    return (low + high) / 2


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="../shared/models/stories260K-hf")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=256)
    add_forward_option(parser)
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--low-share", type=float, default=0.1)
    parser.add_argument("--tight-ms", type=float, default=300.0)
    asyncio.run(main(parser.parse_args()))
