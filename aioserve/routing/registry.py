"""Find routers by name, entry point (``aioserve.routers``) or ``"package.module:Class"``."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from aioserve.routing.router import Router
from aioserve.scheduling.registry import instantiate, load_class

ENTRY_POINT_GROUP = "aioserve.routers"

#: The built-in routers: name -> ``"package.module:Class"``.
BUILTIN_ROUTERS = {
    "round_robin": "aioserve.routing.balance:RoundRobin",
    "least_outstanding": "aioserve.routing.balance:LeastOutstanding",
    "pow2": "aioserve.routing.balance:PowerOfTwo",
    "prefix": "aioserve.routing.prefix:PrefixAffinity",
}


def available_routers() -> list[str]:
    """The built-in routers' names and those of the ``aioserve.routers`` entry points."""
    return sorted({*BUILTIN_ROUTERS, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def load_router(spec: str | Router, params: Mapping[str, Any] | None = None) -> Router:
    """A router instance for a name, a ``"package.module:Class"`` or an instance.

    Args:
        spec: the router.
        params: constructor parameters (``--router-config``); not with an instance.

    Raises:
        ValueError: unknown name (the registered ones listed), unimportable module, a
            parameter unknown or of the wrong type, a value the constructor refuses, or an
            object without ``choose(request, loads)``."""
    if not isinstance(spec, str):
        if params:
            raise ValueError("router parameters need a router name, not an instance")
        return spec
    cls = load_class(spec, ENTRY_POINT_GROUP, "router", BUILTIN_ROUTERS)
    if not callable(cls):
        raise ValueError(f"router {spec!r} is not a class")
    return instantiate(spec, cls, params, "router", "choose(request, loads)")  # type: ignore[no-any-return]
