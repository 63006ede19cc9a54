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

The kernels are built once per environment, never on the serving path
(:mod:`~aioserve.runners.cpu.native_build`: a build folder per interpreter, torch,
compiler and sources; a background build where none is finished). A process that finds a
finished build loads it in milliseconds; one that does not serves with the stock kernels
and switches to the compiled ones once their build is ready, at a moment no request
runs (:class:`KernelSwitch`): the compiled decode attention sums in another order than
the stock paths, so a request must run on one or the other from its first token to its
last. ``AIOSERVE_NATIVE_KERNELS=0`` keeps the stock kernels.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import weakref

import torch

from aioserve.runners.cpu import native_build
from aioserve.runners.cpu.native_build import STALE_LOCK_S, BuildFolder, wait_for_build_lock

__all__ = ["KernelSwitch", "STALE_LOCK_S", "activate", "available", "build_now",
           "decode_attention", "greedy_tokens", "rope_and_cache", "wait_for_build_lock"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_active: bool | None = None  # None: not looked at yet
_pending: BuildFolder | None = None  # a build this process waits for
_builder: subprocess.Popen[bytes] | None = None


def _wanted() -> bool:
    return os.environ.get("AIOSERVE_NATIVE_KERNELS", "1") != "0"


def _load(folder: BuildFolder) -> bool:
    """Load a finished build into this process (False, logged, where that fails)."""
    try:
        torch.ops.load_library(str(folder.library))
        return hasattr(torch.ops.aioserve_cpu, "decode_attention")
    except Exception as error:  # a library built for another torch or CPU
        logger.warning("native CPU kernels unavailable (%s: %s); using stock kernels",
                       folder.library, str(error).splitlines()[0] if str(error) else error)
        return False


def _first_use() -> bool:
    """Load this environment's finished build, or start one in the background."""
    global _pending
    if not _wanted():
        return False
    try:
        folder = BuildFolder()
        state = folder.state()
    except Exception as error:  # an unreadable cache folder: stock kernels serve
        logger.warning("native CPU kernels unavailable (%s); using stock kernels", error)
        return False
    if state == "ready":
        return _load(folder)
    if state == "failed":
        logger.warning("native CPU kernels unavailable (their build failed: %s; see %s); "
                       "using stock kernels", folder.failure(), folder.log)
        return False
    if state == "absent":
        global _builder
        try:
            _builder = native_build.build_in_background(folder)
        except OSError as error:  # a read-only cache folder, no fork: stock kernels serve
            logger.warning("native CPU kernels unavailable (cannot start their build: %s); "
                           "using stock kernels", error)
            return False
    _pending = folder
    return False


def available() -> bool:
    """Whether the compiled kernels are in use in this process. Never compiles: the first
    call loads this environment's finished build (milliseconds) or starts one in the
    background and answers False until :func:`activate` switches the kernels in."""
    global _active
    if _active is None:
        with _lock:
            if _active is None:
                _active = _first_use()
    return _active


def activate() -> bool:
    """Switch the compiled kernels in if the build this process waits for is finished
    (True once: the caller makes sure no request is running)."""
    global _active, _pending, _builder
    if _pending is None or _active:
        return False
    if _builder is not None and _builder.poll() is not None:
        _builder = None  # reaped
    state = _pending.state()
    if state in ("building", "absent"):
        return False
    with _lock:
        folder, _pending = _pending, None
        _active = state == "ready" and _load(folder)
        if state == "failed":
            logger.warning("the native CPU kernels' build failed (%s; see %s); the stock "
                           "kernels keep serving", folder.failure(), folder.log)
    if _active:
        logger.info("the native CPU kernels' background build finished: switched to them "
                    "(%s)", folder.path)
    return bool(_active)


def build_now() -> bool:
    """Build (or wait for another process's build) and load the kernels, blocking
    (tests; an image's build step: ``python -m aioserve.runners.cpu.native_build``)."""
    global _active, _pending
    if available() or not _wanted():
        return bool(_active)
    folder = BuildFolder()
    with _lock:
        _active = native_build.build(folder) and _load(folder)
        _pending = None
    return _active


class KernelSwitch:
    """One runner's part in :func:`activate`: the kernels switch in only while every
    live runner of the process is idle (between :meth:`idle` and :meth:`busy`)."""

    _runners: weakref.WeakSet[KernelSwitch] = weakref.WeakSet()

    def __init__(self) -> None:
        self.is_idle = False
        KernelSwitch._runners.add(self)

    @property
    def pending(self) -> bool:
        """Whether a background build may still switch the kernels in (the engine then
        calls :meth:`idle` now and then while it is idle, so that the switch, and its
        log line, come when the build finishes, not at the next request)."""
        return _pending is not None and not _active

    def busy(self) -> None:
        """A step is about to run."""
        self.is_idle = False

    def idle(self) -> bool:
        """No request of this runner is running: switch if every runner is idle and the
        build is ready (True: switched)."""
        self.is_idle = True
        if _pending is None or not all(r.is_idle for r in KernelSwitch._runners):
            return False
        return activate()


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
