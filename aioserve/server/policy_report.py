"""A running engine's policy report (``Scheduler.report()``), read safely for /metrics
and the live page."""

from __future__ import annotations

import logging
import math

from aioserve.engine import AsyncEngine
from aioserve.scheduling import PolicyReport

log = logging.getLogger(__name__)


def policy_report(engine: AsyncEngine) -> tuple[str, PolicyReport]:
    """(policy name, its report with only finite numbers), or ("", {}) while no engine
    runs; a report() that raises or returns something else counts as empty (logged)."""
    core = engine.core if engine.is_running else None
    if core is None:
        return "", {}
    policy = core.scheduler
    name = policy.name or type(policy).__name__
    try:
        raw = policy.report()
    except Exception:  # a user's policy: contained like its other hooks
        log.exception("policy %s: report() raised", name)
        return name, {}
    clean: PolicyReport = {}
    if not isinstance(raw, dict):
        return name, clean
    for key, value in raw.items():
        if isinstance(value, dict):
            clean[str(key)] = {str(k): float(v) for k, v in value.items()
                               if isinstance(v, (int, float)) and math.isfinite(v)}
        elif isinstance(value, (int, float)) and math.isfinite(value):
            clean[str(key)] = float(value)
    return name, clean
