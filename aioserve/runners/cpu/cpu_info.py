"""The CPU this process runs on, as /proc/cpuinfo states it: its model and the
instruction-set flags its kernels are chosen (and compiled) for."""

from __future__ import annotations

import platform

__all__ = ["CPU_FEATURES", "cpu_features", "cpu_flags_line", "cpu_model"]

#: CPU flags (as /proc/cpuinfo spells them) that choose the kernels this engine runs:
#: MKL's and oneDNN's code paths, ATen's vector width, the compiled kernels.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                "amx_int8", "asimd", "sve")


def _cpuinfo_line(prefixes: tuple[str, ...]) -> str:
    """The first /proc/cpuinfo line starting with one of ``prefixes`` ("" if none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            return next((line for line in cpuinfo if line.startswith(prefixes)), "")
    except OSError:
        return ""


def cpu_flags_line() -> str:
    """The CPU's instruction-set flags as /proc/cpuinfo states them (x86 ``flags``, Arm
    ``Features``); :func:`platform.processor` where there is no /proc/cpuinfo."""
    return _cpuinfo_line(("flags", "Features")) or platform.processor()


def cpu_features() -> list[str]:
    """The :data:`CPU_FEATURES` this CPU has, in that order."""
    flags = set(cpu_flags_line().split(":", 1)[-1].split())
    return [feature for feature in CPU_FEATURES if feature in flags]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else :func:`platform.processor`, else "?"."""
    line = _cpuinfo_line(("model name", "Model"))
    return line.split(":", 1)[1].strip() if ":" in line else platform.processor() or "?"
