"""Issue 32's cluster floor: two engine replicas on Ray Serve (one thread each) against the
simulated two-replica cluster on the same Mooncake window at about 0.9x the pair's capacity,
per router: mean TTFT, the routers' order, and the prefix-cache hit rate by prompt tokens.

python3 benchmarks/cluster_vs_ray.py --model ../shared/models/stories260K-hf

Capacity: the Ray pair's throughput with every request at t=0 under round robin (requests /
makespan, from the first send to the last finish). The simulated replicas' step cost: the
engine's profile, calibrated in this process on one thread before Ray starts, times one factor
that makes the simulated pair's burst throughput equal the real pair's (what the served path
adds per step: HTTP, Serve's proxy and ingress on the same cores); the profile's own figures
are printed beside. Every real run starts on freshly deployed replicas (cold prefix caches)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
from typing import Any

from aioserve import AsyncEngine, EngineConfig
from aioserve.bench.online.serving import run_serving
from aioserve.bench.server_process import free_port
from aioserve.reports.cluster import cluster_figures
from aioserve.reports.serving import summarize
from aioserve.routing.registry import load_router
from aioserve.server import ServerConfig
from aioserve.sim.calibrate import calibrate, match_throughput
from aioserve.sim.cluster import ClusterResult, simulate_cluster
from aioserve.sim.real import sim_config_of
from aioserve.sim.simulator import SimConfig
from aioserve.workloads.body import workload_requests
from aioserve.workloads.scenarios import load_workload

TRACE = ("../shared/traces/mooncake-2025-conversation.jsonl:start=1800,n=200,len_scale=1/32,"
         "max_len=512")
MODEL_NAME = "bench"


def hit_rate(result: ClusterResult) -> float:
    """Prompt tokens served from the prefix cache over prompt tokens, over the replicas."""
    cached = sum(r.num_cached_tokens for rep in result.replicas for r in rep.finished.values())
    return cached / sum(w.prompt_len for w in result.workload)


def mean_ttft_s(result: ClusterResult) -> float:
    arrivals = {w.id: w.arrival_s for w in result.workload}
    return statistics.fmean(r.metrics.first_token_time - arrivals[k]
                            for rep in result.replicas for k, r in rep.finished.items()
                            if r.metrics.first_token_time is not None)


async def burst_capacity(burst: str, config: SimConfig) -> float:
    """The simulated pair's throughput on ``burst`` (every request at t=0), round robin."""
    return float(cluster_figures(await simulated(burst, "round_robin", config))["throughput_req_s"])


async def simulated(spec: str, router: str, config: SimConfig) -> ClusterResult:
    return await simulate_cluster(load_workload(spec), replicas=2, router=router,
                                  scheduler="fcfs", config=config)


async def profile_of(engine_config: EngineConfig, rounds: int) -> tuple[SimConfig, int]:
    """The simulated replica (this engine's profile) and the model's vocabulary size."""
    async with AsyncEngine(engine_config) as engine:
        profile = await calibrate(engine, rounds=rounds)
        return sim_config_of(engine, cost_model=profile), engine.runner.vocab_size


def served(engine_config: EngineConfig, router: str, port: int, spec: str, vocab: int
           ) -> dict[str, float]:
    """One run on two fresh Ray Serve replicas behind ``router``: mean TTFT (s), prefix-cache
    hit rate by prompt tokens, throughput (requests / s from first send to last finish)."""
    from ray import serve
    from ray.serve.exceptions import RayServeException

    from aioserve.deploy.ray_serve import APP_NAME, RayServeOptions, start

    with contextlib.suppress(RayServeException):  # none before the first run
        serve.delete(APP_NAME)  # fresh replicas: cold prefix caches
    options = RayServeOptions(num_replicas=2, router=router,
                              ray_actor_options={"num_cpus": 1})
    url = start(engine_config, ServerConfig(served_model_name=MODEL_NAME), options, port=port,
                num_cpus=4)
    warm_up = workload_requests("poisson:n=4,rate=1000,seed=99", vocab)

    async def run() -> dict[str, float]:
        await run_serving(url, warm_up, endpoint="completions")  # distinct prompts: no hits
        records, duration, used = await run_serving(url, workload_requests(spec, vocab),
                                                    endpoint="completions")
        result = summarize(records, duration, used)
        if result.failed:
            raise RuntimeError(f"{result.failed} requests failed on {router}")
        return {"mean_ttft_s": result.metrics["ttft"]["mean_ms"] / 1e3,
                "hit_rate": result.metrics["prefix_hit_rate"],
                "throughput": result.metrics["request_throughput"]}

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="../shared/models/stories260K-hf")
    parser.add_argument("--trace", default=TRACE, help="a trace window (README: Real traces)")
    parser.add_argument("--routers", default="round_robin,prefix")
    parser.add_argument("--load", type=float, default=0.9, help="multiple of the capacity")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=256)
    parser.add_argument("--calibration-rounds", type=int, default=2)
    args = parser.parse_args()
    routers = args.routers.split(",")
    for flag, check, values in (("--routers", load_router, routers),
                                ("--trace", load_workload, [args.trace])):
        for value in values:  # refused before anything starts
            try:
                check(value)
            except ValueError as exc:
                parser.error(f"{flag}: {exc}")
    os.environ["AIOSERVE_NUM_THREADS"] = "1"  # this engine and the replicas (Ray inherits it)
    os.environ.setdefault("RAY_worker_niceness", "0")  # Ray's nice 15 starves on a busy box
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    engine_config = EngineConfig(model=args.model, device="cpu", max_num_seqs=args.slots,
                                 num_kv_blocks=args.kv_blocks, max_model_len=512,
                                 enable_prefix_caching=True)
    config, vocab = asyncio.run(profile_of(engine_config, args.calibration_rounds))
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)  # no access-log flood
    port = free_port()
    burst = f"{args.trace},speed=1e9"
    capacity = served(engine_config, "round_robin", port, burst, vocab)["throughput"]
    scaled, factor = asyncio.run(match_throughput(
        config, capacity, lambda c: burst_capacity(burst, c)))
    spec = f"{args.trace},rate={args.load * capacity:.3f}"
    print(f"capacity of the Ray pair (all at t=0, round robin): {capacity:.2f} req/s; the "
          f"simulated step cost is the in-process profile x {factor:.2f}\n{spec}")
    real: dict[str, list[dict[str, float]]] = {r: [] for r in routers}
    for _ in range(args.repeats):  # routers interleaved: drift hits each alike
        for router in routers:
            real[router].append(served(engine_config, router, port, spec, vocab))
    rows: dict[str, Any] = {}
    print(f"{'router':<14}{'real mean TTFT s (median [min-max])':>38}{'sim':>8}{'err':>8}"
          f"{'profile only':>14}{'real hit %':>12}{'sim hit %':>11}")
    for router in routers:
        ttft = [run["mean_ttft_s"] for run in real[router]]
        hits = [run["hit_rate"] for run in real[router]]
        sim = asyncio.run(simulated(spec, router, scaled))
        plain = asyncio.run(simulated(spec, router, config))
        rows[router] = {"real": statistics.median(ttft), "sim": mean_ttft_s(sim)}
        error = 100 * (rows[router]["sim"] - rows[router]["real"]) / rows[router]["real"]
        print(f"{router:<14}{statistics.median(ttft):>17.3f} [{min(ttft):.3f}-{max(ttft):.3f}]"
              f"{'':>6}{rows[router]['sim']:>8.3f}{error:>+7.1f}%{mean_ttft_s(plain):>14.3f}"
              f"{100 * statistics.median(hits):>12.1f}{100 * hit_rate(sim):>11.1f}")
    order_real = sorted(routers, key=lambda r: rows[r]["real"])
    order_sim = sorted(routers, key=lambda r: rows[r]["sim"])
    print(f"order by mean TTFT: real {order_real}, sim {order_sim}, same: "
          f"{order_real == order_sim}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
