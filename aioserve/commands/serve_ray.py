"""``aioserve serve --ray``: the same OpenAI endpoint, served by engine replicas on Ray Serve."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from aioserve.bench.server_process import free_port
from aioserve.commands.common import json_object
from aioserve.config import EngineConfig


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Ray Serve (needs aioserve[ray])")
    group.add_argument("--ray", action="store_true",
                       help="serve with engine replicas on Ray Serve instead of in-process")
    group.add_argument("--num-replicas", type=int, default=1, help="engine replicas")
    group.add_argument("--autoscaling", default=None, metavar="JSON",
                       help='Serve autoscaling config, e.g. \'{"min_replicas": 1, '
                            '"max_replicas": 4}\' (overrides --num-replicas)')
    group.add_argument("--ingress-replicas", type=int, default=1,
                       help="HTTP ingress replicas that forward to the engines")
    group.add_argument("--ray-address", default=None,
                       help="existing Ray cluster (auto, ray://HOST:10001); "
                            "default: start a local instance")
    group.add_argument("--ray-num-cpus", type=int, default=None,
                       help="CPUs of the local Ray instance (default: all)")
    group.add_argument("--replica-num-cpus", type=float, default=1.0,
                       help="CPUs reserved per engine replica")
    group.add_argument("--replica-num-gpus", type=float, default=0.0,
                       help="GPUs reserved per engine replica (1 for one engine per GPU)")
    group.add_argument("--router", default="pow2",
                       help="replica choice: an aioserve router, as `simulate --router` "
                            "runs it (round_robin, least_outstanding, pow2, prefix, an "
                            "aioserve.routers entry point or package.module:Class)")
    group.add_argument("--router-config", default=None, metavar="JSON",
                       help="the router's parameters, e.g. '{\"load_bound\": 0.5}'")
    group.add_argument("--stream-interval", type=float, default=0.02,
                       help="seconds over which a stream's chunks are merged into one Ray "
                            "Serve item (0: each chunk at once)")


def ray_options(args: argparse.Namespace) -> Any:
    """RayServeOptions from parsed options; ValueError naming the option."""
    from aioserve.deploy.ray_serve import RayServeOptions

    autoscaling = json_object(args.autoscaling, "--autoscaling",
                              "'{\"min_replicas\": 1, \"max_replicas\": 4}'")
    router_params = json_object(args.router_config, "--router-config", "'{\"load_bound\": 0.5}'")
    actor = {"num_cpus": args.replica_num_cpus}
    if args.replica_num_gpus:
        actor["num_gpus"] = args.replica_num_gpus
    from aioserve.routing.registry import load_router

    try:
        load_router(args.router, router_params)
    except ValueError as exc:
        flag = "--router-config" if "unknown router" not in str(exc) else "--router"
        raise ValueError(f"{flag}: {exc}") from None
    # --max-waiting (on by default) holds in each engine (its EngineConfig) and, summed over
    # the replicas, at the ingress: Serve's max_queued_requests, answered 429 as well
    from aioserve.engine.admission import serve_max_waiting

    waiting = serve_max_waiting(getattr(args, "max_waiting", None), args.max_num_seqs)
    replicas = (autoscaling or {}).get("max_replicas", args.num_replicas)
    queued = waiting * int(replicas) if waiting else -1
    return RayServeOptions(num_replicas=args.num_replicas, autoscaling_config=autoscaling,
                           max_queued_requests=queued,
                           ingress_replicas=args.ingress_replicas,
                           ray_actor_options=actor, router=args.router,
                           router_params=router_params,
                           stream_interval=args.stream_interval)


def run_ray(args: argparse.Namespace, config: EngineConfig, server_config: Any) -> int:
    """Deploy on Ray Serve and serve until SIGINT/SIGTERM, then shut it down."""
    try:
        from ray import serve

        from aioserve.deploy.ray_serve import start
    except ImportError as exc:
        raise ValueError(f"--ray needs Ray Serve: pip install 'aioserve[ray]' ({exc})") from None
    options = ray_options(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    port = args.port or free_port(args.host)
    url = start(config, server_config, options, host=args.host, port=port,
                address=args.ray_address, num_cpus=args.ray_num_cpus)
    print(f"listening on {url}", flush=True)
    stop.wait()
    serve.delete("aioserve")
    if args.ray_address is None:
        serve.shutdown()
    return 0
