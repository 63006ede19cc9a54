"""Find scheduling policies by name: entry points, or ``"package.module:Class"``."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from aioserve.scheduling import Scheduler

ENTRY_POINT_GROUP = "aioserve.schedulers"


def available_schedulers() -> list[str]:
    """Names registered under the ``aioserve.schedulers`` entry-point group."""
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def _load_class(spec: str) -> type:
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"scheduler {spec!r}: cannot import {module_name!r}: {exc}") from exc
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ValueError(f"scheduler {spec!r}: {module_name!r} has no {attr!r}") from None
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
    if not matches:
        known = ", ".join(available_schedulers()) or "none (is aioserve installed?)"
        raise ValueError(
            f"unknown scheduler {spec!r}; registered: {known}; or use 'package.module:Class'"
        )
    return matches[0].load()


def load_scheduler(spec: str | Scheduler) -> Scheduler:
    """Return a policy instance for a name, a ``"package.module:Class"`` or an instance.

    Raises:
        ValueError: the name is unknown, the module cannot be imported, or the
            object is not a scheduler.
    """
    if not isinstance(spec, str):
        return spec
    cls = _load_class(spec)
    scheduler = cls()
    if not callable(getattr(scheduler, "schedule", None)):
        raise ValueError(f"scheduler {spec!r} has no schedule(state) method")
    return scheduler
