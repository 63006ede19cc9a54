"""The CPU this process runs on, per /proc/cpuinfo: its model and instruction-set flags."""

from __future__ import annotations

import platform

__all__ = ["CPU_FEATURES", "cpu_features", "cpu_flags_line", "cpu_model"]

#: CPU flags (as /proc/cpuinfo spells them) that choose the kernels this engine runs:
#: MKL's and oneDNN's code paths, ATen's vector width, the compiled kernels.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                "amx_int8", "asimd", "sve")


def _cpuinfo_line(prefixes: tuple[str, ...]) -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            return next((line for line in cpuinfo if line.startswith(prefixes)), "")
    except OSError:
        return ""


def cpu_flags_line() -> str:
    """The CPU's flags line (x86 ``flags``, Arm ``Features``), else :func:`platform.processor`."""
    return _cpuinfo_line(("flags", "Features")) or platform.processor()


def cpu_features() -> list[str]:
    flags = set(cpu_flags_line().split(":", 1)[-1].split())
    return [feature for feature in CPU_FEATURES if feature in flags]


def cpu_model() -> str:
    line = _cpuinfo_line(("model name", "Model"))
    return line.split(":", 1)[1].strip() if ":" in line else platform.processor() or "?"
