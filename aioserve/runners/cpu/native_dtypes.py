"""Which reduced-precision dtypes this CPU computes natively, decided from its flags alone (no
torch, no model), and the dtype ``--dtype auto`` serves a checkpoint in on the CPU.

bfloat16 is native with AVX512-BF16 or AMX-BF16 (x86) or the ``bf16`` feature (Arm); float16
with AVX512-FP16 or AMX-FP16 (x86). Elsewhere torch emulates them in float32, slower than
float32 itself."""

from __future__ import annotations

import os

from aioserve.runners.cpu.cpu_info import cpu_flags_line, cpu_model

__all__ = ["NATIVE_FLAGS", "DtypeChoice", "auto_dtype", "check_dtype", "native_dtypes"]

#: CPU flags (as /proc/cpuinfo spells them) that make a dtype native.
NATIVE_FLAGS = {
    "bfloat16": ("avx512_bf16", "amx_bf16", "bf16"),
    "float16": ("avx512_fp16", "amx_fp16"),
}


def native_dtypes(flags_line: str | None = None) -> list[str]:
    """``float32`` and each dtype of :data:`NATIVE_FLAGS` this CPU (or ``flags_line``) runs."""
    line = cpu_flags_line() if flags_line is None else flags_line
    flags = set(line.split(":", 1)[-1].split())
    return ["float32", *(dtype for dtype, names in NATIVE_FLAGS.items()
                         if any(name in flags for name in names))]


def _on_cpu(device: str) -> bool:
    """Whether ``device`` is the CPU (``auto`` without an NVIDIA device node)."""
    return device == "cpu" or (device == "auto" and not os.path.exists("/dev/nvidiactl"))


def check_dtype(dtype: str, device: str, flags_line: str | None = None) -> None:
    """Refuse ``dtype`` on a CPU that has no native arithmetic for it (only float16, which CPUs
    without AVX512-FP16/AMX-FP16 emulate); decides from the CPU flags, before torch or the model
    loads.

    Raises:
        ValueError: names ``--dtype``, the dtype, the CPU and the dtypes it runs natively."""
    if dtype != "float16" or not _on_cpu(device):
        return
    native = native_dtypes(flags_line)
    if dtype not in native:
        raise ValueError(
            f"--dtype float16: this CPU ({cpu_model()}) has no native half-precision "
            f"arithmetic (no {' or '.join(NATIVE_FLAGS['float16'])}); it runs "
            f"{', '.join(native)} natively: use --dtype auto, {' or '.join(native)}")


class DtypeChoice:
    """What ``--dtype auto`` serves a checkpoint in on the CPU, and why (for the start-up log).

    Args:
        dtype: ``"float32"`` or ``"bfloat16"``.
        reason: one sentence."""

    def __init__(self, dtype: str, reason: str) -> None:
        self.dtype = dtype
        self.reason = reason


def auto_dtype(checkpoint: str | None, native: list[str]) -> DtypeChoice:
    """The checkpoint's dtype where the CPU runs it natively and it is served exactly in a batch
    (bfloat16), else float32; ``checkpoint`` as its config spells it (None: unstated)."""
    if checkpoint == "bfloat16" and "bfloat16" in native:
        return DtypeChoice("bfloat16", "the checkpoint's dtype, native on this CPU")
    if checkpoint == "bfloat16":
        return DtypeChoice("float32", "the checkpoint is bfloat16 but this CPU has no native "
                                      "bfloat16 arithmetic (no AVX512-BF16/AMX-BF16)")
    if checkpoint == "float16":
        return DtypeChoice("float32", "the checkpoint is float16, which the CPU kernels do not "
                                      "serve exactly in a batch (no fixed-order float16 path)")
    return DtypeChoice("float32", f"the checkpoint's dtype ({checkpoint or 'unstated'})")
