"""Compiled CPU kernels for the step's memory-bound parts: decode attention over the
paged cache in place, linear products over panels, and greedy token choice.

A decode group's attention (one query per sequence) is memory work: every key and
value row of every context is read once per step. Stock PyTorch kernels either copy
each context out of the paged cache first (:mod:`~aioserve.runners.attention.decode_gather`)
or read a row once per query head (:mod:`~aioserve.runners.attention.sparse_decode`). The op in
``csrc/decode_attention.cpp`` walks each sequence's block table and reads each K/V row once
for all the query heads that share it (grouped-query attention), split over
(sequence, KV head) pairs on torch's intra-op threads, with each pair's scores and
softmax in a buffer of its own (e^x by Cephes' polynomial). vLLM's CPU backend does
the same in its own C++ kernels (``csrc/cpu/attention.cpp``); these are written for
this engine's cache layouts. ``torch.argmax`` over a step's logits is a scalar loop;
the second op reads each row once in vector lanes. Linear products of packed models
run over weights in panels of 16 columns (``csrc/panel_linear.cpp``,
:mod:`~aioserve.runners.cpu.panel_linear`).

Every (sequence, head) result is summed in a fixed order that depends only on that
sequence's own context, so a request's numbers do not depend on its batch-mates.
Measured on the 2-core development box, one layer, 32 sequences with 7,486 keys in
all (blocks in order, cache warm): SmolLM2-135M's heads (9 query, 3 KV, dim 64)
1.63 ms (sparse kernels) -> 0.46 ms; 4 sequences 193 -> 60 us; the test model's heads
(8 / 4, dim 8) 0.76 (block gather and batched products) -> 0.24 ms. Greedy choice over
``[32, 49152]`` logits: 1.9 ms (``argmax``) -> 0.43 ms.

The kernels are built on first use with torch's C++ extension loader (a C++ compiler
and ninja: ``pip install 'aioserve[kernels]'`` or a system ninja; 15-25 s once on the
2-core box, then cached under ``~/.cache/torch_extensions``). Where
the build fails, or with ``AIOSERVE_NATIVE_KERNELS=0``, :func:`available` is False and
the stock-kernel paths serve.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

__all__ = ["available", "decode_attention", "greedy_tokens", "rope_and_cache"]

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
#: The kernels' sources (one extension; ``vec8.h`` is their shared vector arithmetic).
SOURCES = [CSRC / name for name in ("decode_attention.cpp", "greedy_tokens.cpp",
                                    "panel_linear.cpp", "rope_and_cache.cpp")]
_lock = threading.Lock()
_loaded: bool | None = None


def _machine_tag() -> str:
    """What the build depends on besides the source: torch, and the CPU (the kernels
    are compiled for the machine's own instruction set)."""
    flags = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags += next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags += platform.processor()
    return f"{torch.__version__}|{flags}"


#: A build lock older than this (seconds) is a killed build's: a build takes 15-25 s.
STALE_LOCK_S = 120.0


def _build_directory(name: str) -> Path:
    """The build folder of ``name`` (created): under ``TORCH_EXTENSIONS_DIR``, else
    under torch's default root in a per-Python folder, as torch's loader lays them out."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        from torch.utils.cpp_extension import get_default_build_root

        python = f"py{sys.version_info.major}{sys.version_info.minor}{sys.abiflags}"
        root = os.path.join(get_default_build_root(), f"{python}_cpu")
    directory = Path(root) / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def wait_for_build_lock(lock: Path) -> None:
    """Wait while another process builds (its ``lock`` file younger than
    :data:`STALE_LOCK_S`), and remove a lock left by a build that was killed: torch's
    loader would wait for it for ever."""
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > STALE_LOCK_S:
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            logger.warning("removed a stale build lock %s (%.0f s old)", lock, age)
            return
        time.sleep(0.5)


def _ninja_on_path() -> None:
    """Put the ``ninja`` package's binary (the ``kernels`` extra) on ``PATH`` when no ``ninja`` is
    there: torch's loader runs it by name, and pip may install console scripts outside
    ``PATH``."""
    if shutil.which("ninja") is None:
        with contextlib.suppress(ImportError, AttributeError):
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _build() -> bool:
    """Compile and load the kernels; False (logged) where that fails."""
    if os.environ.get("AIOSERVE_NATIVE_KERNELS", "1") == "0":
        return False
    try:
        from torch.utils.cpp_extension import load

        _ninja_on_path()

        sources = b"".join(path.read_bytes() for path in [*SOURCES, CSRC / "vec8.h"])
        digest = hashlib.sha256(sources + _machine_tag().encode()).hexdigest()[:16]
        logger.info("loading the native CPU kernels aioserve_cpu_%s (built on first use, "
                    "15-25 s, then cached)", digest)
        name = f"aioserve_cpu_{digest}"
        build_directory = _build_directory(name)
        wait_for_build_lock(build_directory / "lock")
        load(
            name=name, sources=[str(path) for path in SOURCES],
            build_directory=str(build_directory),
            extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
            is_python_module=False, verbose=False,
        )
        return hasattr(torch.ops.aioserve_cpu, "decode_attention")
    except Exception as error:  # no compiler, no ninja, a failed build: stock kernels serve
        logger.warning("native CPU kernels unavailable (%s); using stock kernels",
                       str(error).splitlines()[0] if str(error) else type(error).__name__)
        return False


def available() -> bool:
    """Whether the compiled kernels are loaded. The first call builds or loads them
    (15-25 s on a 2-core machine the first time, under a lock shared by processes);
    it never raises: a failed build logs a warning and gives False for the process."""
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                _loaded = _build()
    return _loaded


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
    scaling: float | None,
) -> torch.Tensor:
    """Attention of one query per sequence over its own context in the paged cache.

    Args:
        q: ``[b, heads, k_dim]`` float32; heads a multiple of kv_heads (head
            h reads KV head ``h // (heads // kv_heads)``).
        k_cache, v_cache: ``[rows, kv_heads, dim]`` float32 with unit stride over dim
            (head-major or token-major storage).
        block_tables: ``[b, W]`` int64, contiguous, each sequence's KV blocks in order.
        seq_lens: ``[b]`` int64, each sequence's context length (tokens, <= W *
            block_size).
        block_size: tokens per block.
        scaling: score scale (default ``k_dim ** -0.5``).

    Returns:
        ``[b, heads, v_dim]`` float32.

    Raises:
        RuntimeError: shapes, dtypes or layouts other than the above (from the kernels).
    """
    q = q.contiguous()
    scale = scaling if scaling is not None else int(q.shape[-1]) ** -0.5
    out = q.new_empty((int(q.shape[0]), int(q.shape[1]), int(v_cache.shape[-1])))
    torch.ops.aioserve_cpu.decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out
    )
    return out


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """``[R]`` int64, each row's first index of its largest value, as
    ``logits.argmax(-1)`` (NaN counts as largest); the compiled kernel reads each row
    once, about 4x faster than ``argmax`` on ``[32, 49152]`` float32.

    Args:
        logits: ``[R, V]`` float32 on the CPU (any layout; copied when not contiguous).

    Raises:
        RuntimeError: not float32 / not two-dimensional, or the kernels are not loaded.
    """
    out = torch.empty(int(logits.shape[0]), dtype=torch.int64)
    torch.ops.aioserve_cpu.greedy_tokens(logits.contiguous(), out)
    return out


def rope_and_cache(
    qk: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
    slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int,
) -> torch.Tensor:
    """The lean forward's rotary step in one call: ``x * cos + swap_halves(x) *
    signed_sin`` for queries and keys (one product, one product, one sum, each rounded:
    torch's bits), keys and values written to their cache slots; returns the queries.

    Args:
        qk: ``[T, heads + kv_heads, dim]`` float32 (unit stride over dim), queries then keys.
        v: ``[T, kv_heads, v_dim]`` float32 (unit stride over v_dim).
        cos, signed_sin: ``[T, 1, dim]`` float32, contiguous
            (:meth:`~aioserve.runners.model.lean_llama.LeanLlama._rope`).
        slot_mapping: ``[T]`` int64, each token's cache slot.
        k_cache, v_cache: ``[rows, kv_heads, dim]`` / ``[rows, kv_heads, v_dim]``, written.
        heads: query heads.

    Returns:
        ``[T, heads, dim]`` float32, contiguous: the rotated queries.

    Raises:
        RuntimeError: shapes, dtypes or layouts other than the above, a slot outside the
            cache (from the kernel).
    """
    q = qk.new_empty((int(qk.shape[0]), heads, int(qk.shape[2])))
    torch.ops.aioserve_cpu.rope_and_cache(qk, v, cos, signed_sin, slot_mapping, k_cache,
                                          v_cache, q)
    return q
