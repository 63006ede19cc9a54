"""``aioserve serve --ray`` options and the deployment settings they give (no Ray
instance is started)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve", reason="needs aioserve[ray]")

from aioserve.cli import build_parser  # noqa: E402
from aioserve.commands.serve_ray import ray_options  # noqa: E402
from aioserve.deploy.ray_serve import RayServeOptions  # noqa: E402


def parse(*extra: str):
    return build_parser().parse_args(["serve", "--model", "m", "--ray", *extra])


def test_cli_options_become_deployment_settings():
    options = ray_options(parse("--num-replicas", "4", "--replica-num-gpus", "1",
                                "--router", "prefix", "--prefix-chars", "64"))
    settings = options.replica_settings()
    assert settings["num_replicas"] == 4
    assert options.prefix_chars == 64
    assert settings["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1.0}
    router = settings["request_router_config"]
    assert router.request_router_kwargs == {"imbalanced_threshold": 8}


def test_autoscaling_replaces_the_replica_count():
    options = ray_options(parse("--autoscaling", '{"min_replicas": 1, "max_replicas": 3}'))
    settings = options.replica_settings()
    assert settings["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3}
    assert "num_replicas" not in settings and "request_router_config" not in settings


@pytest.mark.parametrize("argv", [["--autoscaling", "[1]"], ["--autoscaling", "{"],
                                  ["--num-replicas", "0"]])
def test_bad_options_are_value_errors(argv):
    with pytest.raises(ValueError):
        ray_options(parse(*argv))


def test_unknown_router_is_refused():
    with pytest.raises(ValueError, match="router"):
        RayServeOptions(router="random")
