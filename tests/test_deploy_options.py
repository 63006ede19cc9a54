"""``aioserve serve --ray`` options and the deployment settings they give (no Ray
instance is started)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve", reason="needs aioserve[ray]")

from aioserve.cli import build_parser  # noqa: E402
from aioserve.commands.serve_ray import ray_options  # noqa: E402
from aioserve.deploy.contract_router import ContractRouter  # noqa: E402
from aioserve.deploy.ray_serve import RayServeOptions  # noqa: E402
from aioserve.engine.admission import DEFAULT_WAITING_BATCHES  # noqa: E402


def parse(*extra: str):
    return build_parser().parse_args(["serve", "--model", "m", "--ray", *extra])


def test_cli_options_become_deployment_settings():
    options = ray_options(parse("--num-replicas", "4", "--replica-num-gpus", "1",
                                "--router", "prefix", "--router-config", '{"load_bound": 0.5}'))
    settings = options.replica_settings(kv_blocks=96)
    assert settings["num_replicas"] == 4
    assert settings["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1.0}
    router = settings["request_router_config"]
    assert router.request_router_kwargs == {"router": "prefix", "kv_blocks": 96,
                                            "router_params": {"load_bound": 0.5},
                                            "view": "EngineReplica"}
    assert router.request_router_class.endswith("ContractRouter")
    default = RayServeOptions().replica_settings()["request_router_config"]
    assert default.request_router_kwargs["router"] == "pow2"


@pytest.mark.parametrize("name", ["round_robin", "least_outstanding", "pow2", "prefix"])
def test_every_router_of_the_simulator_serves(name):
    kwargs = RayServeOptions(router=name).replica_settings()["request_router_config"]
    router = ContractRouter.__new__(ContractRouter)
    router.initialize_state(**kwargs.request_router_kwargs)
    assert router.router.name == name


def test_max_waiting_bounds_each_engine_and_serve_s_queue():
    """--max-waiting holds in every engine and, summed over the replicas, as Serve's
    max_queued_requests (answered 429 by the ingress and the proxy)."""
    options = ray_options(parse("--num-replicas", "2", "--max-waiting", "8"))
    assert options.max_queued_requests == 16
    assert options.replica_settings()["max_queued_requests"] == 16
    # Serve's own answer to a full queue of the engines is a 429 too (its default is 503)
    assert options.replica_settings()["backpressure_config"].status_code == 429
    assert RayServeOptions().replica_settings()["max_queued_requests"] == -1
    assert options.target_replicas == 2
    scaled = ray_options(parse("--autoscaling", '{"min_replicas": 2, "max_replicas": 3}'))
    assert scaled.target_replicas == 2
    # on by default: DEFAULT_WAITING_BATCHES of --max-num-seqs (32) per replica, 3 at most
    assert scaled.max_queued_requests == DEFAULT_WAITING_BATCHES * 32 * 3
    assert ray_options(parse("--max-waiting", "none")).max_queued_requests == -1
    with pytest.raises(ValueError, match="max_queued_requests"):
        RayServeOptions(max_queued_requests=0)


def test_autoscaling_replaces_the_replica_count():
    options = ray_options(parse("--autoscaling", '{"min_replicas": 1, "max_replicas": 3}'))
    settings = options.replica_settings()
    assert settings["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3}
    assert "num_replicas" not in settings


@pytest.mark.parametrize("argv", [["--autoscaling", "[1]"], ["--autoscaling", "{"],
                                  ["--num-replicas", "0"], ["--router-config", "[1]"],
                                  ["--router", "prefix", "--router-config", '{"eps": 1}']])
def test_bad_options_are_value_errors(argv):
    with pytest.raises(ValueError):
        ray_options(parse(*argv))


@pytest.mark.parametrize(("argv", "message"), [
    (["--router", "nope"], "--router: unknown router 'nope'; registered: least_outstanding"),
    (["--router", "pow2", "--router-config", '{"seed": "x"}'],
     "--router-config: router 'pow2': parameter 'seed'"),
    (["--autoscaling", "{"], "--autoscaling: not valid JSON"),
    (["--autoscaling", "[1]"], "--autoscaling: must be a JSON object"),
    (["--router-config", "[1]"], "--router-config: must be a JSON object"),
])
def test_router_refusals_name_the_flag(argv, message):
    with pytest.raises(ValueError) as exc:
        ray_options(parse(*argv))
    assert message in str(exc.value)


def test_unknown_router_is_refused():
    with pytest.raises(ValueError, match="unknown router 'random'; registered: least_outstanding"):
        RayServeOptions(router="random")


class Replica:
    def __init__(self, unique_id: str) -> None:
        self.replica_id = type("Id", (), {"unique_id": unique_id})()


def pending(key: str, **kwargs):
    return type("Pending", (), {"kwargs": kwargs,
                                "metadata": type("Meta", (), {"internal_request_id": key})()})()


async def test_contract_router_counts_what_it_sent_until_serve_says_it_ended():
    from aioserve.routing.router import RouteRequest

    router = ContractRouter.__new__(ContractRouter)
    router.initialize_state("least_outstanding", {"by": "tokens"})
    replicas = [Replica("b"), Replica("a")]  # indices by id: a is 0, b is 1
    big = RouteRequest("x", 100, 50)
    ranks = await router.choose_replicas(replicas, pending("r1", route=big))
    assert [r[0].replica_id.unique_id for r in ranks] == ["a", "b"]
    assert (router.requests, router.tokens) == ({"a": 1}, {"a": 150})
    again = await router.choose_replicas(replicas, pending("r1", route=big))  # a backoff
    assert again[0][0].replica_id.unique_id == "a" and router.requests == {"a": 1}
    small = await router.choose_replicas(replicas, pending("r2", route=RouteRequest("y", 5, 5)))
    assert small[0][0].replica_id.unique_id == "b"
    pinned = await router.choose_replicas(replicas, pending("s", replica="a"))
    assert pinned[0][0].replica_id.unique_id == "a"
    assert router.requests == {"a": 2, "b": 1} and router.tokens == {"a": 150, "b": 10}
    for key in ("r1", "s", "unknown"):
        router.on_request_completed(replicas[0].replica_id, key)
    assert router.requests == {"a": 0, "b": 1} and router.tokens == {"a": 0, "b": 10}
