"""Why vtc misses its light-TTFT floor (issue 31): the light tenant's mean TTFT over its
TTFT alone (heavy tenant alone at 2x capacity, 600 requests, 8 slots, 64 KV blocks) under
vtc, the paper's rule (no preemption), the artifact's router (no preemption, admissions
every 10 decode steps, S-LoRA's ``max_wait_tokens``) and an idealised rule that is not
VTC (light first, preempting as many heavy requests as it takes); and vtc's light
requests split by whether their tenant's counter was above the heavy one's at arrival.
``--light`` and ``--burst`` (comma lists) sweep the light tenant's share of the requests
and the arrivals' burstiness (the mean number arriving at once; 1 is Poisson), the heavy
tenant held at 2x capacity.

python3 benchmarks/vtc_light_ttft.py --profile profile.json   # or --model M (calibrates)
python3 benchmarks/vtc_light_ttft.py --profile profile.json --light 0.05,0.1 --burst 1,2"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from policy_floors import capacity, mean, ttfts  # noqa: E402

from aioserve import AsyncEngine, EngineConfig  # noqa: E402
from aioserve.commands.common import positive_floats  # noqa: E402
from aioserve.scheduling import RequestView, SchedulerOutput, SchedulerState  # noqa: E402
from aioserve.sim.calibrate import calibrate  # noqa: E402
from aioserve.sim.simulator import SimConfig, simulate  # noqa: E402
from aioserve.sim.step_cost import StepCostModel  # noqa: E402
from aioserve.workloads.scenarios import two_tenants  # noqa: E402
from schedulers.vtc import VTCScheduler  # noqa: E402


class ArtifactRouter(VTCScheduler):
    """VTC as the artifact's router runs it: no preemption; while requests run, new ones
    are admitted only after 10 decode steps since the last admission."""

    def __init__(self) -> None:
        super().__init__(preempt=False)
        self.since = 0

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        if state.running and not state.preempt_for_growth(self.victims(state)) \
                and self.since < 10:
            self.since += 1
            return SchedulerOutput()
        decision = super().schedule(state)
        if decision.admit:
            self.since = 0
        return decision


class LightFirst(VTCScheduler):
    """Not VTC: the light tenant's requests first, as many heavy ones preempted as it takes."""

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        growth = state.preempt_for_growth(self.victims(state))
        if growth:
            return SchedulerOutput(preempt=growth)
        admission = state.admission()
        victims = [r for r in reversed(state.running) if r.tenant != "light"]
        preempt: list[str] = []
        for request in (r for r in state.waiting if r.tenant == "light"):
            while not admission.fits(request) and victims:
                admission.release(victims[0])
                preempt.append(victims.pop(0).request_id)
            if not admission.fits(request):
                break
            admission.admit(request)
        if not preempt:
            reserve = int(self.watermark * state.num_total_blocks)
            admission.fill([r for r in state.waiting if r.tenant != "light"], reserve)
        return SchedulerOutput(admit=admission.admitted, preempt=preempt)


class CounterAtArrival(VTCScheduler):
    """vtc, noting whether the light tenant's counter is above the heavy one's at arrival."""

    def __init__(self) -> None:
        super().__init__()
        self.above: dict[str, bool] = {}

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        super().on_arrival(request, state)
        if request.tenant == "light":
            self.above[request.request_id] = self.counter("light") > self.counter("heavy")


async def one_seed(config: SimConfig, cap: float, light_share: float, burst: float,
                   seed: int) -> None:
    workload = two_tenants(n=600, rate=2 * cap / (1 - light_share), light=light_share,
                           burst=burst, seed=seed)
    light = [w for w in workload if w.meta.tenant == "light"]
    alone = mean(ttfts(await simulate(light, "fcfs", config), lambda w: True))
    figures = []
    noted = CounterAtArrival()
    for name, policy in (("vtc", noted),
                         ("paper (no preemption)", VTCScheduler(preempt=False)),
                         ("artifact router", ArtifactRouter()),
                         ("idealised light-first", LightFirst())):
        result = await simulate(workload, policy, config)
        got = mean(ttfts(result, lambda w: w.meta.tenant == "light"))
        figures.append(f"{name} {got / alone:.2f}x")
        if policy is noted:
            split = [ttfts(result, lambda w, a=above: noted.above.get(w.id) is a)
                     for above in (True, False)]
    print(f"seed {seed}: light alone {1e3 * alone:.1f} ms; " + ", ".join(figures)
          + f"; vtc's light requests arriving with its counter above the heavy one's: "
          f"{len(split[0])} of {len(split[0]) + len(split[1])}"
          + (f", mean TTFT {1e3 * mean(split[0]):.0f} ms against {1e3 * mean(split[1]):.0f} ms"
             if split[0] else ""))


async def main(args: argparse.Namespace) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}")
    fields: dict[str, Any] = {"slots": args.slots, "kv_blocks": args.kv_blocks,
                              "max_model_len": 512, "overlap": True}
    if args.profile:
        model = StepCostModel.load(args.profile)
    else:
        engine_config = EngineConfig(model=args.model, max_num_seqs=args.slots,
                                     num_kv_blocks=args.kv_blocks)
        async with AsyncEngine(engine_config) as engine:
            model = await calibrate(engine, rounds=2)
    config = SimConfig(cost_model=model, **fields)
    cap = await capacity(two_tenants, config)
    print(f"a decode step of 8 rows {model.cost_ms(8, 0, 8 * 100):.2f} ms; capacity "
          f"{cap:.1f} requests/s")
    for light in args.light:
        for burst in args.burst:
            print(f"light tenant {light:g} of the requests ({2 * light / (1 - light):.2f}x "
                  f"capacity), burst {burst:g}:")
            for seed in range(args.seeds):
                await one_seed(config, cap, light, burst, seed)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="../shared/models/stories260K-hf")
    parser.add_argument("--profile", help="a calibrated profile (aioserve simulate --calibrate)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--light", type=positive_floats, default=[0.1],
                        help="the light tenant's shares of the requests (comma list)")
    parser.add_argument("--burst", type=positive_floats, default=[2.0],
                        help="mean requests arriving at once, 1 = Poisson (comma list)")
    arguments = parser.parse_args()
    if not all(light < 1 for light in arguments.light):
        parser.error("--light: shares of the requests must be < 1")
    if not all(burst >= 1 for burst in arguments.burst):
        parser.error("--burst: the mean number arriving at once must be >= 1")
    asyncio.run(main(arguments))
