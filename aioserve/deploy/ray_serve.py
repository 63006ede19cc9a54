"""aioserve on Ray Serve: ``start(EngineConfig(...), ServerConfig(), RayServeOptions())``."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import serve
from ray.serve.config import BackpressureConfig, RequestRouterConfig

from aioserve.config import EngineConfig
from aioserve.deploy.contract_router import ContractRouter
from aioserve.deploy.ingress import APP_NAME as APP_NAME
from aioserve.deploy.ingress import BACKPRESSURE_RETRY_AFTER_S, OpenAIIngress
from aioserve.deploy.ingress import REPLICA_DEPLOYMENT as REPLICA_DEPLOYMENT
from aioserve.deploy.replica import EngineReplica
from aioserve.routing.registry import load_router
from aioserve.server import ServerConfig

logger = logging.getLogger("aioserve.deploy")

#: The ingress's deployment name (the app's and the replicas' are in ingress.py).
INGRESS_DEPLOYMENT = "OpenAIIngress"

#: Blocks the prefix router indexes per replica when the engine sizes its KV cache itself.
INDEX_BLOCKS = 4096


@dataclass(frozen=True)
class RayServeOptions:
    """How the app is deployed.

    Attributes:
        num_replicas: engine replicas (ignored with ``autoscaling_config``).
        autoscaling_config: Serve's autoscaling config, or None for a fixed count.
        ray_actor_options: resources of each engine replica, e.g. ``{"num_gpus": 1}``.
        ingress_replicas, ingress_actor_options: the ingress's count and resources.
        max_ongoing_requests: per engine replica; above ``max_num_seqs`` so the engine queues.
        router, router_params: an aioserve router (``aioserve.routing``: a built-in name,
            an ``aioserve.routers`` entry point or ``"package.module:Class"``) and its
            parameters, asked by :class:`ContractRouter`: the routers the cluster
            simulator runs.
        stream_interval: seconds over which stream chunks merge into one Serve item.
        max_queued_requests: Serve's bound on requests queued for the engine replicas
            (and for the ingress) beyond ``max_ongoing_requests``; one more is answered 429
            ``queue_full`` with ``Retry-After``. -1: no bound. Each engine's own
            ``EngineConfig.max_waiting`` holds per replica besides.

    Raises:
        ValueError: unknown router or bad parameters, or a count out of range."""

    num_replicas: int = 1
    autoscaling_config: dict[str, Any] | None = None
    ray_actor_options: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 1})
    ingress_replicas: int = 1
    ingress_actor_options: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 0.1})
    max_ongoing_requests: int = 256
    router: str = "pow2"
    router_params: dict[str, Any] | None = None
    stream_interval: float = 0.02
    max_queued_requests: int = -1

    def __post_init__(self) -> None:
        load_router(self.router, self.router_params)  # a ValueError names the router
        for name in ("num_replicas", "ingress_replicas", "max_ongoing_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queued_requests == 0 or self.max_queued_requests < -1:
            raise ValueError(f"max_queued_requests must be >= 1 or -1 (no bound), got "
                             f"{self.max_queued_requests}")
        if self.stream_interval < 0:
            raise ValueError(f"stream_interval must be >= 0, got {self.stream_interval}")

    @property
    def target_replicas(self) -> int:
        """Replicas the router must see before ``/health`` says ready (autoscaling: its
        ``min_replicas``, at least 1)."""
        if self.autoscaling_config is not None:
            return max(1, int(self.autoscaling_config.get("min_replicas", 1)))
        return self.num_replicas

    def replica_settings(self, kv_blocks: int | None = None) -> dict[str, Any]:
        """Serve's deployment options of the engine replicas (``kv_blocks``: each engine's,
        None when it sizes its cache itself)."""
        settings: dict[str, Any] = {
            "name": REPLICA_DEPLOYMENT,
            "ray_actor_options": self.ray_actor_options,
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_queued_requests,
            # Serve's answer when the engines' queue is full: 429, as the proxy's
            "backpressure_config": BackpressureConfig(
                status_code=429, retry_after_s=BACKPRESSURE_RETRY_AFTER_S),
        }
        if self.autoscaling_config is not None:
            settings["autoscaling_config"] = self.autoscaling_config
        else:
            settings["num_replicas"] = self.num_replicas
        settings["request_router_config"] = RequestRouterConfig(
            # Ray takes the class itself or its import path; its hint says dict
            request_router_class=ContractRouter,  # type: ignore[arg-type]
            request_router_kwargs={"router": self.router, "router_params": self.router_params,
                                   "kv_blocks": kv_blocks or INDEX_BLOCKS,
                                   "view": REPLICA_DEPLOYMENT},
        )
        return settings


def build_app(
    engine_config: EngineConfig, server_config: ServerConfig, options: RayServeOptions
) -> serve.Application:
    # serve.deployment(cls, **options) returns the Deployment; Ray's overloads type the
    # keyword-only form as a decorator
    replica: serve.Deployment = serve.deployment(  # type: ignore[assignment]
        EngineReplica, **options.replica_settings(engine_config.num_kv_blocks))
    ingress: serve.Deployment = serve.deployment(  # type: ignore[assignment]
        OpenAIIngress, name=INGRESS_DEPLOYMENT, num_replicas=options.ingress_replicas,
        ray_actor_options=options.ingress_actor_options,
        max_ongoing_requests=options.max_ongoing_requests * options.num_replicas,
        max_queued_requests=options.max_queued_requests,
        backpressure_config=BackpressureConfig(  # the proxy's answer to a full queue
            status_code=429, retry_after_s=BACKPRESSURE_RETRY_AFTER_S),
    )
    engines = replica.bind(engine_config, server_config, options.stream_interval)
    return ingress.bind(engines, engine_config.tokenizer or engine_config.model,
                        engine_config.block_size, max_model_len=engine_config.max_model_len,
                        target_replicas=options.target_replicas)


def start(
    engine_config: EngineConfig, server_config: ServerConfig, options: RayServeOptions,
    *, host: str = "127.0.0.1", port: int = 8000, address: str | None = None,
    num_cpus: int | None = None,
) -> str:
    """Connect to Ray (``address``; None starts a local instance), start Serve's proxy on
    ``host:port``, deploy the app, wait for every replica to load and for ``/health`` to
    say the ingress's router sees them all (logged with the count), and return the base
    URL ``http://HOST:PORT``.

    Raises:
        RuntimeError: a replica failed to start (e.g. the model cannot be loaded), or the
            router did not see every replica within ``READY_TIMEOUT_S``."""
    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=num_cpus, include_dashboard=False)
        else:
            ray.init(address=address)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(engine_config, server_config, options), name=APP_NAME,
              route_prefix="/")
    url = f"http://{host}:{port}"
    replicas = wait_ready(url)
    logger.info("ready: the ingress's router sees %d of %d engine replicas", replicas,
                options.target_replicas)
    return url


#: Seconds :func:`start` waits for the router to see every replica.
READY_TIMEOUT_S = 120.0


def wait_ready(url: str, timeout_s: float = READY_TIMEOUT_S, poll_s: float = 0.1) -> int:
    """Poll ``GET /health`` until 200; the replicas the router sees. RuntimeError with the
    last answer after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                return int(json.loads(response.read())["replicas"])
        except urllib.error.HTTPError as exc:
            last = f"{exc.code} {exc.read().decode(errors='replace')[:200]}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(poll_s)
    raise RuntimeError(f"not ready after {timeout_s:g} s: /health answered {last}")


def replica_handle() -> serve.handle.DeploymentHandle[Any]:
    """A handle of the running app's engine replicas (for :meth:`EngineReplica.stats`)."""
    return serve.get_deployment_handle(REPLICA_DEPLOYMENT, app_name=APP_NAME)
