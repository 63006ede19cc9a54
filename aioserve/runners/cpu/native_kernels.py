"""Compiled CPU kernels for the step's memory-bound parts: decode attention over the paged cache
in place (each K/V row read once for all its query heads, as vLLM's CPU backend), rope-and-cache,
and greedy choice.

Each (sequence, head) sums in a fixed order of its own context, so results do not depend on
batch-mates. But that order differs from the stock paths', so a process switches to a build that
finishes in the background only while no request runs (:class:`KernelSwitch`).
``AIOSERVE_NATIVE_KERNELS=0`` keeps the stock kernels."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import threading
import weakref

import torch

from aioserve.runners.cpu import native_build
from aioserve.runners.cpu.native_build import BuildFolder

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_active: bool | None = None  # None: not looked at yet
_pending: BuildFolder | None = None  # a build this process waits for
_builder: subprocess.Popen[bytes] | None = None


def _wanted() -> bool:
    return os.environ.get("AIOSERVE_NATIVE_KERNELS", "1") != "0"


def _load(folder: BuildFolder) -> bool:
    try:
        torch.ops.load_library(str(folder.library))
        return hasattr(torch.ops.aioserve_cpu, "decode_attention")
    except Exception as error:  # a library built for another torch or CPU
        logger.warning("native CPU kernels unavailable (%s: %s); using stock kernels",
                       folder.library, str(error).splitlines()[0] if str(error) else error)
        return False


def _first_use() -> bool:
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
    """Whether the compiled kernels are in use; never compiles."""
    global _active
    if _active is None:
        with _lock:
            if _active is None:
                _active = _first_use()
    return _active


def activate() -> bool:
    """Switch the kernels in once their build is finished (True once)."""
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
    """Build (or wait for) and load the kernels, blocking (tests, image builds)."""
    global _active, _pending
    if available() or not _wanted():
        return bool(_active)
    folder = BuildFolder()
    with _lock:
        _active = native_build.build(folder) and _load(folder)
        _pending = None
    return _active


class KernelSwitch:
    """One runner's part in :func:`activate`: it switches only while every runner is idle."""

    _runners: weakref.WeakSet[KernelSwitch] = weakref.WeakSet()

    def __init__(self) -> None:
        self.is_idle = False
        KernelSwitch._runners.add(self)

    @property
    def pending(self) -> bool:
        """Whether a background build may still switch in (the engine then polls :meth:`idle`)."""
        return _pending is not None and not _active

    def busy(self) -> None:
        self.is_idle = False

    def close(self) -> None:
        """A closed runner no longer holds the switch back (one shut down mid-step stays
        busy, and a cache may keep it alive: aiohttp's keeps its last 1,024 apps)."""
        KernelSwitch._runners.discard(self)

    def idle(self) -> bool:
        """No request of this runner runs: switch if possible (True: switched)."""
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
        q: ``[b, heads, k_dim]`` float32 or bfloat16; head h reads KV head
            ``h // (heads // kv_heads)``.
        k_cache, v_cache: ``[rows, kv_heads, dim]`` float32 or bfloat16 (both the same), unit
            stride over dim; bfloat16 rows are widened to float32 as they are read.
        block_tables: ``[b, W]`` int64, contiguous; seq_lens: ``[b]`` int64 tokens.
        scaling: score scale (default ``k_dim ** -0.5``).

    Returns:
        ``[b, heads, v_dim]`` in ``q``'s dtype (float32 sums, rounded once at the end).
        RuntimeError for other shapes, dtypes or layouts."""
    q = q.contiguous()
    scale = scaling if scaling is not None else int(q.shape[-1]) ** -0.5
    out = q.new_empty((int(q.shape[0]), int(q.shape[1]), int(v_cache.shape[-1])))
    torch.ops.aioserve_cpu.decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out
    )
    return out


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` of ``[R, V]`` float32 CPU logits, each row read once."""
    out = torch.empty(int(logits.shape[0]), dtype=torch.int64)
    torch.ops.aioserve_cpu.greedy_tokens(logits.contiguous(), out)
    return out


def rope_and_cache(
    qk: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
    slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int,
) -> torch.Tensor:
    """The lean forward's rotary step in one call with torch's bits: rotates queries and keys of
    ``qk`` ``[T, heads + kv_heads, dim]``, writes keys and ``v`` to their ``slot_mapping`` slots,
    and returns the queries ``[T, heads, dim]``; every tensor float32, or every one bfloat16 (each
    product and the sum rounded to bfloat16, as torch's ops round them). RuntimeError for other
    shapes or dtypes, or a slot outside the cache."""
    q = qk.new_empty((int(qk.shape[0]), heads, int(qk.shape[2])))
    torch.ops.aioserve_cpu.rope_and_cache(qk, v, cos, signed_sin, slot_mapping, k_cache,
                                          v_cache, q)
    return q


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A bfloat16 residual add and LlamaRMSNorm in one call, with torch's bits where
    :func:`add_rms_norm_exact` holds.

    Args:
        x: ``[T, hidden]`` bfloat16, contiguous; delta: the same, or None (no add).
        weight: ``[hidden]`` bfloat16; eps: the norm's epsilon.

    Returns:
        ``(x + delta, weight * (s * rsqrt(mean(s * s) + eps)).to(bfloat16))`` with
        ``s = float(x + delta)``, each op rounded as torch's. RuntimeError for other shapes or
        dtypes."""
    x_out, h_out = torch.empty_like(x), torch.empty_like(x)
    empty = x.new_empty(0)
    torch.ops.aioserve_cpu.add_rms_norm(x, empty if delta is None else delta, weight, eps,
                                        x_out, h_out)
    return x_out, h_out


@functools.cache
def add_rms_norm_exact(hidden: int) -> bool:
    """Whether :func:`add_rms_norm` gives torch's ops' bits for rows of ``hidden`` here (it
    follows torch's CPU sum order, which a torch build could change): 64 rows of widely
    scaled values, with and without the add, once a process per width."""
    generator = torch.Generator().manual_seed(hidden)
    scales = torch.logspace(-4, 4, 64)[:, None]
    x = (torch.randn(64, hidden, generator=generator) * scales).bfloat16()
    delta = (torch.randn(64, hidden, generator=generator) * scales).bfloat16()
    weight = torch.randn(hidden, generator=generator).bfloat16()
    for add in (None, delta):
        s = x if add is None else x + add
        s32 = s.to(torch.float32)
        want = weight * (s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(
            torch.bfloat16)
        got_x, got_h = add_rms_norm(x, add, weight, 1e-6)
        if not (torch.equal(got_x, s) and torch.equal(got_h, want)):
            return False
    return True


@functools.cache
def _silu_table() -> torch.Tensor:
    """torch's ``F.silu`` of every bfloat16 value (indexed by its bits), widened to float32."""
    values = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return torch.nn.functional.silu(values).float()


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` ``[T, 2 I]`` bfloat16 (gate, then up) -> ``[T, I]``,
    in one call with torch's ops' bits: silu from a table of torch's own silu of every bfloat16
    value, the product rounded as torch rounds it. RuntimeError for other shapes or dtypes."""
    out = gate_up.new_empty((int(gate_up.shape[0]), int(gate_up.shape[1]) // 2))
    torch.ops.aioserve_cpu.silu_and_mul(gate_up.contiguous(), _silu_table(), out)
    return out

