"""``aioserve simulate --replicas N --router a,b``: the workload on N replicas, per router."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from aioserve.commands.common import json_object, positive_int, scheduler_params
from aioserve.commands.simulate_options import slo_title
from aioserve.reports.cluster import cluster_figures, format_cluster
from aioserve.reports.replica_search import fewest_replicas, format_replica_search
from aioserve.routing.registry import BUILTIN_ROUTERS, available_routers, load_router
from aioserve.scheduling.registry import load_scheduler, params_by_policy
from aioserve.sim.cluster import simulate_cluster
from aioserve.sim.simulator import SimConfig
from aioserve.workloads.request import WorkloadRequest

#: ``simulate`` options a cluster run does not take.
_SINGLE_ONLY = ("real", "calibrate", "html", "plot", "report", "sweep_rate", "max_concurrency")


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """Add --replicas, --router, --fewest-replicas and --router-config."""
    add = parser.add_argument
    add("--replicas", type=positive_int, default=None,
        help="simulate N replicas behind a router (each the engine with --scheduler and "
        "the engine options); prints a table per router")
    add("--router", default=None,
        help=f"with --replicas: comma-separated routers ({', '.join(BUILTIN_ROUTERS)}, an "
        "aioserve.routers entry point or package.module:Class; default round_robin)")
    add("--fewest-replicas", type=positive_int, default=None, metavar="MAX",
        help="search 1..MAX replicas for the fewest whose SLO attainment meets "
        "--target-attainment at the workload's rate, per policy and router")
    add("--router-config", default=None, metavar="JSON",
        help="with --replicas: router parameters, one object for all or keyed by router, "
        "e.g. '{\"prefix\": {\"load_bound\": 0.5}}'")


def wants_cluster(args: argparse.Namespace) -> bool:
    """Whether any cluster option was given (the run is then a cluster run)."""
    return (args.replicas is not None or args.router is not None
            or args.router_config is not None or args.fewest_replicas is not None)


def router_params(text: str | None, names: list[str]) -> dict[str, dict[str, Any] | None]:
    """Each router's parameters from ``--router-config`` (ValueError naming the flag)."""
    params = json_object(text, "--router-config", "'{\"load_bound\": 0.5}'")
    if params is None:
        return dict.fromkeys(names)
    if params and all(isinstance(v, dict) for v in params.values()) and set(params) <= set(names):
        return {name: params.get(name) for name in names}
    return dict.fromkeys(names, params)


def check_cluster(args: argparse.Namespace) -> tuple[list[str], dict[str, dict[str, Any] | None]]:
    """The routers and their parameters, every refusal named by its flag before a run."""
    for name in _SINGLE_ONLY:
        if getattr(args, name):
            raise ValueError(f"--{name.replace('_', '-')}: not with --replicas/--router (a "
                             "single replica's option)")
    if args.fewest_replicas is not None:
        if args.replicas is not None:
            raise ValueError("--fewest-replicas: searches the replica count; not with --replicas")
        if not 0 < args.target_attainment <= 1:
            raise ValueError("--target-attainment: must be in (0, 1]")
    names = [n.strip() for n in (args.router or "round_robin").split(",") if n.strip()]
    if not names:
        raise ValueError(f"--router: give at least one router ({', '.join(available_routers())})")
    params = router_params(args.router_config, names)
    for name in names:
        try:
            load_router(name)
        except ValueError as exc:
            raise ValueError(f"--router: {exc}") from None
        try:
            load_router(name, params[name])
        except ValueError as exc:
            raise ValueError(f"--router-config: {exc}") from None
    return names, params


def run_cluster(args: argparse.Namespace, workload: list[WorkloadRequest], policies: list[str],
                config: SimConfig, routers: list[str],
                params: dict[str, dict[str, Any] | None]) -> int:
    """Every policy x router on ``--replicas`` replicas (``routers`` and ``params`` from
    :func:`check_cluster`): the tables, then one JSON object per run with ``--json``."""
    policy_params = params_by_policy(policies, scheduler_params(args.scheduler_config))
    for policy in policies:
        try:
            load_scheduler(policy, policy_params[policy])
        except ValueError as exc:
            raise ValueError(f"--scheduler/--scheduler-config: {exc}") from None
    if args.fewest_replicas is not None:
        return _search(args, workload, policies, config, routers, params, policy_params)
    runs = []
    for policy in policies:
        for router in routers:
            result = asyncio.run(simulate_cluster(
                workload, args.replicas or 1, router, policy, config, params[router],
                policy_params[policy]))
            runs.append(cluster_figures(result, args.slo_ttft_ms, args.slo_tpot_ms))
    print(format_cluster(runs, f"simulated: {args.workload} on {args.replicas or 1} replicas"))
    if args.json:
        for figures in runs:
            print(json.dumps(figures))
    return 0


def _search(args: argparse.Namespace, workload: list[WorkloadRequest], policies: list[str],
            config: SimConfig, routers: list[str], params: dict[str, dict[str, Any] | None],
            policy_params: dict[str, dict[str, Any] | None]) -> int:
    """``--fewest-replicas``: the table of each policy x router's fewest replicas."""
    searches = [asyncio.run(fewest_replicas(
        workload, policy, router, config, args.target_attainment, args.fewest_replicas,
        args.slo_ttft_ms, args.slo_tpot_ms, params[router], policy_params[policy]))
        for policy in policies for router in routers]
    print(format_replica_search(searches, f"simulated: {args.workload}; {slo_title(args)}"))
    if args.json:
        for s in searches:
            print(json.dumps({"policy": s.policy, "router": s.router, "target": s.target,
                              "replicas": s.replicas, "tried": {
                                  str(n): {"attainment": a, "goodput_req_s": g}
                                  for n, (a, g) in sorted(s.tried.items())}}))
    return 0
