"""How many CPUs this process may really use: affinity and cgroup quota, not ``os.cpu_count()``."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["affinity_cpus", "cgroup_cpu_quota", "usable_cpus"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_cpus() -> frozenset[int]:
    """The CPU ids this process may run on (all where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if text is None:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _ancestors(base: Path, cgroup_path: str) -> list[Path]:
    """``base/cgroup_path`` and each folder above it up to ``base``."""
    parts = [p for p in cgroup_path.split("/") if p]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_cpu_quota(proc_cgroup: str, root: Path = CGROUP_ROOT) -> float | None:
    """The smallest CPU quota (e.g. 1.5) over this process's cgroups, or None."""
    quotas: list[float] = []
    for line in proc_cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            bases, read = [root, root / "unified"], _v2_quota
        elif "cpu" in controllers.split(","):
            bases, read = [root / controllers, root / "cpu", root / "cpu,cpuacct"], _v1_quota
        else:
            continue
        for base in dict.fromkeys(bases):
            if base.is_dir():
                quotas += [q for d in _ancestors(base, path) if (q := read(d)) is not None]
    return min(quotas) if quotas else None


def usable_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """``min(affinity, ceil(cgroup quota))``, at least 1."""
    count = len(affinity_cpus())
    text = _read(proc_cgroup)
    quota = cgroup_cpu_quota(text, root) if text is not None else None
    if quota is not None:
        count = min(count, math.ceil(quota - 1e-9))
    return max(1, count)
