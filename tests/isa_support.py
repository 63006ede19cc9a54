"""Which x86 instruction set oneDNN's kernels use here: the CPU's best, capped by
``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``), so tests promise what holds on the
kernels actually running, not on the CPU's name (issue 26, item 6)."""

from __future__ import annotations

import os
from pathlib import Path

from aioserve.runners.cpu.cpu_info import cpu_flags_line

#: oneDNN's ISA levels this suite tells apart, lowest first.
LEVELS = ("sse41", "avx", "avx2", "avx512")


def cpu_level() -> str:
    """The best of :data:`LEVELS` the CPU has (``avx2`` where /proc/cpuinfo is absent)."""
    if not Path("/proc/cpuinfo").exists():
        return "avx2"
    flags = set(cpu_flags_line().split(":", 1)[-1].split())
    for level, flag in (("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx")):
        if flag in flags:
            return level
    return "sse41"


def onednn_level() -> str:
    """The level oneDNN's kernels run at: :func:`cpu_level`, capped by the environment
    (``AVX2_VNNI`` counts as ``avx2``, any ``AVX512``/``AMX`` cap as ``avx512``)."""
    level = cpu_level()
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
           or "ALL").lower()
    if cap == "all":
        return level
    capped = ("avx512" if cap.startswith(("avx512", "amx", "avx10")) else
              "avx2" if cap.startswith("avx2") else "avx" if cap.startswith("avx") else "sse41")
    return min(level, capped, key=LEVELS.index)
