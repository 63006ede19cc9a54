"""The scheduler lab's floors (issue 31): each literature policy's promise under sustained
overload, in the simulator with a step cost calibrated on this machine (medians over
``--seeds`` seeds), and vtc and priority confirmed on the real engine at a reduced scale.

Capacity: fcfs's saturated throughput on each scenario's request shapes (all requests at
once, finished / makespan, simulated); loads are multiples of it, so the figures fit any
machine. Prints the load average before and after; quote it on a quiet one.

python3 benchmarks/policy_floors.py --model ../shared/models/stories260K-hf"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from aioserve import AsyncEngine, EngineConfig
from aioserve.commands.common import add_forward_option
from aioserve.reports.figures import policy_figures
from aioserve.request import FinishReason
from aioserve.scheduling import StepFeedback
from aioserve.sim.calibrate import calibrate
from aioserve.sim.real import replay, sim_config_of
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.scenarios import heavy_tail, priority_mix, slo_mix, two_tenants
from schedulers.edf import EDFScheduler
from schedulers.mlfq import MLFQScheduler
from schedulers.priority import PriorityScheduler
from schedulers.vtc import VTCScheduler

Scenario = Callable[..., list[WorkloadRequest]]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def ttfts(result: Any, keep: Callable[[WorkloadRequest], bool]) -> list[float]:
    """First-token waits of the finished requests ``keep`` selects."""
    rows = {w.id: w for w in result.workload}
    return [r.metrics.first_token_time - r.arrival_time for k, r in result.finished.items()
            if keep(rows[k]) and r.metrics.first_token_time is not None]


async def capacity(scenario: Scenario, config: SimConfig) -> float:
    """fcfs's saturated throughput (requests/s) on the scenario's shapes."""
    figures = policy_figures(await simulate(scenario(n=400, rate=1e6, seed=99), "fcfs", config))
    return float(figures["throughput_req_s"])


class ServiceWatch:
    """Per-step service of two tenants (prompt once + 2 x output tokens, VTC's count): the
    widest gap while both are backlogged (Theorem 4.4's quantity) and their split then."""

    def __init__(self, workload: list[WorkloadRequest], weights: dict[str, float]) -> None:
        self.tenant = {w.id: w.meta.tenant for w in workload}
        self.prompt = {w.id: w.prompt_len for w in workload}
        self.weights = weights
        self.service: dict[str | None, float] = defaultdict(float)
        self.split: dict[str | None, float] = defaultdict(float)
        self.seen: set[str] = set()
        self.span: list[float] = []
        self.widest = 0.0
        self.both_steps = 0

    def __call__(self, core: Any, feedback: StepFeedback) -> None:
        both = {"heavy", "light"} <= {r.meta.tenant for r in core.waiting}
        for request_id, emitted in zip(feedback.request_ids, feedback.num_emitted_tokens):
            tenant = self.tenant[request_id]
            got = 2.0 * emitted
            if request_id not in self.seen:
                self.seen.add(request_id)
                got += self.prompt[request_id]
            self.service[tenant] += got / self.weights.get(str(tenant), 1.0)
            if both:
                self.split[tenant] += got
        if both:
            self.both_steps += 1
            gap = self.service["heavy"] - self.service["light"]
            self.span[:] = [min(self.span[0], gap), max(self.span[1], gap)] if self.span \
                else [gap, gap]
            self.widest = max(self.widest, self.span[1] - self.span[0])
        else:
            self.span.clear()


async def vtc_floors(config: SimConfig, cap: float, seed: int) -> dict[str, float]:
    # heavy alone at 2x capacity (90% of 2.2x), light at 0.22x; 600 requests
    workload = two_tenants(n=600, rate=2.2 * cap, light=0.1, seed=seed)
    light = [w for w in workload if w.meta.tenant == "light"]
    alone = mean(ttfts(await simulate(light, "fcfs", config), lambda w: True))
    watch = ServiceWatch(workload, {})
    vtc = await simulate(workload, VTCScheduler(), config, on_step=watch)
    fcfs = await simulate(workload, "fcfs", config)
    is_light: Callable[[WorkloadRequest], bool] = lambda w: w.meta.tenant == "light"  # noqa: E731
    kv_tokens = config.block_size * (config.kv_blocks or 0)
    bound = 2 * max(max(w.prompt_len for w in workload), 2 * kv_tokens)
    # weights {light: 3, heavy: 1}, both tenants backlogged (each alone above its share)
    both = two_tenants(n=600, rate=2.5 * cap, light=0.5, seed=seed)
    weighted = ServiceWatch(both, {"light": 3.0})
    await simulate(both, VTCScheduler(weights={"light": 3.0, "heavy": 1.0}), config,
                   on_step=weighted)
    return {"light_x_alone_vtc": mean(ttfts(vtc, is_light)) / alone,
            "light_x_alone_fcfs": mean(ttfts(fcfs, is_light)) / alone,
            "gap_over_bound": watch.widest / bound, "both_steps": watch.both_steps,
            "weighted_split": weighted.split["light"] / weighted.split["heavy"],
            "weighted_steps": weighted.both_steps,
            "preemptions": vtc.preemptions, "recomputed": vtc.preempted_tokens}


async def priority_floors(config: SimConfig, cap: float, seed: int) -> dict[str, float]:
    workload = priority_mix(n=1500, rate=1.25 * cap, high=0.1, seed=seed)
    high = [w for w in workload if w.meta.priority == 0]
    idle = mean(ttfts(await simulate(high, "priority", config), lambda w: True))
    policy = PriorityScheduler(low_share=0.1)
    loaded = await simulate(workload, policy, config)
    fcfs = await simulate(workload, "fcfs", config)
    is_high: Callable[[WorkloadRequest], bool] = lambda w: w.meta.priority == 0  # noqa: E731
    return {"high_x_idle": mean(ttfts(loaded, is_high)) / idle,
            "high_x_idle_fcfs": mean(ttfts(fcfs, is_high)) / idle,
            "low_share": policy.shared / max(policy.contested, 1),
            "low_ttft_s": mean(ttfts(loaded, lambda w: w.meta.priority == 1)),
            "preemptions": loaded.preemptions}


def sustained(rate: float, window_s: float) -> int:
    """Requests that arrive over 10x a policy's aging window at ``rate``."""
    return int(10 * window_s * rate) + 1


async def half_attainment_rate(config: SimConfig, cap: float, tight_ms: float) -> float:
    """The arrival rate at which fcfs attains about 50% on slo-mix over 10x edf's aging
    window (bisection, seed 0)."""
    low, high = 0.7 * cap, 1.6 * cap
    for _ in range(6):
        rate = (low + high) / 2
        workload = slo_mix(n=sustained(rate, EDFScheduler().late_delay_s), rate=rate,
                           tight_ms=tight_ms, loose_ms=10 * tight_ms)
        attained = policy_figures(await simulate(workload, "fcfs", config))["slo_attainment"]
        low, high = (rate, high) if attained > 0.5 else (low, rate)
    return (low + high) / 2


async def edf_floors(config: SimConfig, rate: float, tight_ms: float,
                     seed: int) -> dict[str, float]:
    workload = slo_mix(n=sustained(rate, EDFScheduler().late_delay_s), rate=rate,
                       tight_ms=tight_ms, loose_ms=10 * tight_ms, seed=seed)
    fcfs = policy_figures(await simulate(workload, "fcfs", config))
    edf = policy_figures(await simulate(workload, EDFScheduler(), config))
    shed = await simulate(workload, EDFScheduler(shed_late=True), config)
    streamed = [r for r in shed.finished.values()
                if r.finish_reason is FinishReason.ERROR and r.num_output_tokens > 0]
    return {"fcfs_slo": fcfs["slo_attainment"], "edf_slo": edf["slo_attainment"],
            "shed_slo": policy_figures(shed)["slo_attainment"],
            "tpot_x_fcfs": edf["mean_tpot_s"] / fcfs["mean_tpot_s"],
            "wait_x_fcfs": edf["max_wait_s"] / fcfs["max_wait_s"],
            "streamed_shed": len(streamed)}


async def mlfq_floors(config: SimConfig, cap: float, seed: int) -> dict[str, float]:
    policy = MLFQScheduler()
    workload = heavy_tail(n=sustained(1.2 * cap, policy.promote_after_s), rate=1.2 * cap,
                          seed=seed)
    fcfs = policy_figures(await simulate(workload, "fcfs", config))
    mlfq = policy_figures(await simulate(workload, policy, config))
    return {"e2e_x_fcfs": mlfq["mean_e2e_s"] / fcfs["mean_e2e_s"],
            "preemptions": mlfq["preemptions"], "n": len(workload),
            "share": policy.shared / max(policy.contested, 1)}


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


async def simulated(config: SimConfig, seeds: list[int], tight_ms: float) -> None:
    caps = {name: await capacity(scenario, config) for name, scenario in
            (("two-tenants", two_tenants), ("priority-mix", priority_mix),
             ("slo-mix", slo_mix), ("heavy-tail", heavy_tail))}
    print("capacity (fcfs saturated, simulated): "
          + ", ".join(f"{k} {v:.1f} req/s" for k, v in caps.items()))
    v = [await vtc_floors(config, caps["two-tenants"], s) for s in seeds]
    print(f"vtc      | light tenant mean TTFT / alone: {median(v, 'light_x_alone_vtc'):.2f}x "
          f"(fcfs {median(v, 'light_x_alone_fcfs'):.1f}x) [<= 2x]; widest service gap / "
          f"Theorem 4.4 bound: {max(r['gap_over_bound'] for r in v):.2f} over "
          f"{median(v, 'both_steps'):.0f} backlogged steps [<= 1]; {{light: 3, heavy: 1}} "
          f"split {median(v, 'weighted_split'):.3f} over {median(v, 'weighted_steps'):.0f} "
          f"steps [3 +- 5%]; {median(v, 'preemptions'):.0f} preemptions, "
          f"{median(v, 'recomputed'):.0f} recomputed tokens")
    p = [await priority_floors(config, caps["priority-mix"], s) for s in seeds]
    print(f"priority | high mean TTFT / idle: {median(p, 'high_x_idle'):.2f}x (fcfs "
          f"{median(p, 'high_x_idle_fcfs'):.1f}x) [<= 2x]; low share of contested "
          f"admissions {median(p, 'low_share'):.3f} [0.1 +- 0.05]; low mean TTFT "
          f"{median(p, 'low_ttft_s'):.2f} s; {median(p, 'preemptions'):.0f} preemptions")
    rate = await half_attainment_rate(config, caps["slo-mix"], tight_ms)
    e = [await edf_floors(config, rate, tight_ms, s) for s in seeds]
    print(f"edf      | slo-mix at {rate:.1f} req/s ({rate / caps['slo-mix']:.2f}x capacity, "
          f"{sustained(rate, EDFScheduler().late_delay_s)} requests): "
          f"attainment {100 * median(e, 'edf_slo'):.1f}% vs fcfs "
          f"{100 * median(e, 'fcfs_slo'):.1f}% [+20 points]; mean TPOT "
          f"{median(e, 'tpot_x_fcfs'):.2f}x fcfs [<= 1.5x]; longest wait "
          f"{median(e, 'wait_x_fcfs'):.2f}x fcfs [<= 2x]; shedding: "
          f"{100 * median(e, 'shed_slo'):.1f}%, {max(r['streamed_shed'] for r in e):.0f} "
          "streamed requests shed [0]")
    m = [await mlfq_floors(config, caps["heavy-tail"], s) for s in seeds]
    print(f"mlfq     | heavy-tail at 1.2x capacity, {m[0]['n']} requests, no length known: "
          f"mean E2E {median(m, 'e2e_x_fcfs'):.2f}x fcfs [<= 0.7x]; "
          f"{median(m, 'preemptions'):.0f} preemptions; starving requests' share of "
          f"contested admissions {median(m, 'share'):.3f}")


async def real(engine: AsyncEngine, config: SimConfig, n: int) -> None:
    """vtc's and priority's first floor on the real engine (the simulator's capacities)."""
    cap = await capacity(two_tenants, config)
    workload = two_tenants(n=n, rate=2.2 * cap, light=0.1, seed=1)
    light = [w for w in workload if w.meta.tenant == "light"]
    alone = mean(ttfts(await replay(engine, light, "fcfs"), lambda w: True))
    got = {p: mean(ttfts(await replay(engine, workload, p), lambda w: w.meta.tenant == "light"))
           for p in ("fcfs", "vtc")}
    print(f"real vtc      | {n} requests: light mean TTFT / alone: vtc "
          f"{got['vtc'] / alone:.2f}x, fcfs {got['fcfs'] / alone:.1f}x (alone "
          f"{1e3 * alone:.1f} ms) [<= 2x]")
    cap = await capacity(priority_mix, config)
    workload = priority_mix(n=n, rate=1.25 * cap, high=0.1, seed=1)
    high = [w for w in workload if w.meta.priority == 0]
    idle = mean(ttfts(await replay(engine, high, "priority"), lambda w: True))
    policy = PriorityScheduler(low_share=0.1)
    got = {p: mean(ttfts(await replay(engine, workload, p), lambda w: w.meta.priority == 0))
           for p in ("fcfs", policy)}
    print(f"real priority | {n} requests: high mean TTFT / idle: priority "
          f"{got[policy] / idle:.2f}x, fcfs {got['fcfs'] / idle:.1f}x (idle "
          f"{1e3 * idle:.1f} ms) [<= 2x]; low share {policy.shared / max(policy.contested, 1):.3f}")


async def main(args: argparse.Namespace) -> None:
    config = EngineConfig(model=args.model, max_num_seqs=args.slots,
                          num_kv_blocks=args.kv_blocks, forward=args.forward)
    print(f"load average {os.getloadavg()[0]:.2f}")
    async with AsyncEngine(config) as engine:
        model = await calibrate(engine, rounds=2)
        sim = sim_config_of(engine, cost_model=model)
        print(f"calibrated: {args.slots} slots, {sim.kv_blocks} KV blocks, a decode step of "
              f"8 rows {model.cost_ms(8, 0, 8 * 100):.2f} ms")
        await simulated(sim, list(range(args.seeds)), args.tight_ms)
        if args.real_requests:
            await real(engine, sim, args.real_requests)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="../shared/models/stories260K-hf")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=64)
    add_forward_option(parser)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--real-requests", type=int, default=200,
                        help="requests of each real run (0: simulator only)")
    parser.add_argument("--tight-ms", type=float, default=300.0)
    asyncio.run(main(parser.parse_args()))
