"""``aioserve simulate --replicas N --router a,b``: the workload on N replicas, per router
(the routers and their parameters also for ``aioserve capacity --fewest-replicas``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from aioserve.commands.common import json_object
from aioserve.reports.cluster import cluster_figures, format_cluster
from aioserve.reports.figures import outcomes, rejection_warning
from aioserve.routing.registry import available_routers, load_router
from aioserve.sim.cluster import simulate_cluster
from aioserve.sim.simulator import SimConfig
from aioserve.workloads.request import WorkloadRequest

#: ``simulate`` options a cluster run does not take.
_SINGLE_ONLY = ("real", "html", "plot", "report", "max_concurrency")


def wants_cluster(args: argparse.Namespace) -> bool:
    """Whether any cluster option was given (the run is then a cluster run)."""
    return args.replicas is not None or args.router is not None or args.router_config is not None


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
    for name in _SINGLE_ONLY if args.fewest_replicas is None else ("replicas", "plot"):
        if getattr(args, name):
            raise ValueError(f"--{name.replace('_', '-')}: not with --replicas/--router (a "
                             "single replica's option)")
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


def run_cluster(args: argparse.Namespace, workload: list[WorkloadRequest],
                policy_params: dict[str, dict[str, Any] | None], config: SimConfig,
                routers: list[str], params: dict[str, dict[str, Any] | None]) -> int:
    """Every policy (checked, with its parameters) x router on ``--replicas`` replicas
    (``routers`` and ``params`` from :func:`check_cluster`): the tables, then one JSON
    object per run with ``--json``."""
    runs = []
    for policy in policy_params:
        for router in routers:
            result = asyncio.run(simulate_cluster(
                workload, args.replicas or 1, router, policy, config, params[router],
                policy_params[policy]))
            runs.append(cluster_figures(result, args.slo_ttft_ms, args.slo_tpot_ms))
            warning = rejection_warning(f"{policy} x {router}", [
                o for replica in result.replicas for o in outcomes(replica)])
            if warning is not None:
                print(warning, file=sys.stderr)
    print(format_cluster(runs, f"simulated: {args.workload} on {args.replicas or 1} replicas"))
    if args.json:
        for figures in runs:
            print(json.dumps(figures))
    return 0
