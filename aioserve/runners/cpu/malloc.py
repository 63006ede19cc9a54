"""glibc ``malloc`` thresholds raised so a CPU step's large temporaries are reused, not
page-faulted."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "tune_malloc"]

#: Blocks above this size still get their own ``mmap`` (glibc's largest allowed
#: threshold on 64-bit: ``4 * 1024 * 1024 * sizeof(long)``).
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
#: Free memory at the top of the heap kept for reuse before it goes back to the OS.
TRIM_THRESHOLD_BYTES = 512 * 1024 * 1024

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3


@functools.cache
def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds once; False where not glibc, refused or off."""
    setting = os.environ.get("AIOSERVE_MALLOC_TUNING", "1").strip() or "1"
    if setting not in ("0", "1"):
        raise ValueError(f"AIOSERVE_MALLOC_TUNING must be 0 or 1, got {setting!r}")
    if setting == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
