"""The runner's set-up decisions: device, dtype, context length, EOS ids, memory, threads."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import numpy as np
import torch
from transformers import AutoConfig, GenerationConfig

from aioserve.config import EngineConfig
from aioserve.runners.attention.backend import AttentionBackend
from aioserve.runners.attention.layer_rules import LayerRules
from aioserve.runners.batch_invariance import BatchInvariance
from aioserve.runners.cpu import native_dtypes, packed_linear
from aioserve.runners.cpu.packed_linear import PackedLinear
from aioserve.runners.cpu.row_padding import LinearProduct, RowPadding
from aioserve.runners.cpu.threads.cpu_budget import affinity_cpus, usable_cpus
from aioserve.runners.cpu.threads.cpu_load import LoadMeter
from aioserve.runners.cpu.threads.thread_governor import ThreadGovernor
from aioserve.runners.model import lean_llama
from aioserve.runners.model import loader as model_loader

logger = logging.getLogger("aioserve.threads")
padding_logger = logging.getLogger("aioserve.runners.cpu.row_padding")
dtype_logger = logging.getLogger("aioserve.dtype")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``"auto"``: CUDA when present, else the CPU; ValueError when CUDA is asked for and absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "has no CUDA support" if torch.version.cuda is None else "sees no CUDA device"
        raise ValueError(f"device {name!r}: this torch ({torch.__version__}) {build}; "
                         "use --device cpu or auto")
    return device


def context_length(requested: int | None, text_config: object) -> int:
    """``requested`` or the model's context length (ValueError beyond it)."""
    if requested is None:
        return model_loader.context_length(text_config)
    model_len = getattr(text_config, "max_position_embeddings", None)
    if model_len is not None and requested > int(model_len):
        raise ValueError(f"max_model_len: {requested} exceeds the model's context of "
                         f"{int(model_len)} tokens (max_position_embeddings)")
    return requested


def checkpoint_dtype(model_path: str) -> str | None:
    """The dtype the checkpoint's config states (``dtype`` or ``torch_dtype``), or None."""
    try:
        config = AutoConfig.from_pretrained(model_path).get_text_config()
    except (OSError, ValueError):  # the loader names the problem
        return None
    stated = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return None if stated is None else str(stated).removeprefix("torch.")


def resolve_dtype(name: str, device: torch.device, checkpoint: str | None = None) -> torch.dtype:
    """``name``'s dtype; ``"auto"``: bfloat16 on CUDA; on the CPU the ``checkpoint``'s dtype where
    the CPU runs it natively (and oneDNN does, for bfloat16), else float32 (logged either way).

    Raises:
        ValueError: float16 on a CPU without native half-precision arithmetic."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        native = native_dtypes.native_dtypes()
        if not packed_linear.native_bf16() and "bfloat16" in native:
            native.remove("bfloat16")
        choice = native_dtypes.auto_dtype(checkpoint, native)
        dtype_logger.info("dtype auto: %s (%s)", choice.dtype, choice.reason)
        return _DTYPES[choice.dtype]
    if device.type == "cpu":
        native_dtypes.check_dtype(name, "cpu")
    return _DTYPES[name]


def eos_token_ids(generation_config: GenerationConfig | None) -> tuple[int, ...]:
    eos = generation_config.eos_token_id if generation_config is not None else None
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def free_memory_bytes(device: torch.device) -> int:
    """Free bytes of ``device``: the GPU's free memory, or the RAM available on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def num_kv_blocks(
    config: EngineConfig, device: torch.device, block_bytes: int, max_model_len: int,
) -> int:
    """``config.num_kv_blocks``, else what the memory budget holds (ValueError: none)."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    budget = config.kv_cache_memory_bytes
    if config.kv_cache_memory_fraction is not None:
        budget = int(free_memory_bytes(device) * config.kv_cache_memory_fraction)
    by_memory = budget // block_bytes
    by_need = -(-config.max_num_seqs * max_model_len // config.block_size)
    blocks = min(by_memory, by_need)
    if blocks <= 0:
        raise ValueError("EngineConfig.kv_cache_memory_bytes is too small for one KV block")
    return blocks


def env_count(name: str) -> int | None:
    """A positive integer from environment variable ``name``, or None."""
    value = os.environ.get(name)
    if not value:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def cpu_threads(device: torch.device) -> int | None:
    """Intra-op threads: ``AIOSERVE_NUM_THREADS``, else every usable CPU, else None."""
    budget = env_count("AIOSERVE_NUM_THREADS")
    if device.type != "cpu" or budget is not None:
        return budget
    return usable_cpus()


def _candidates(threads: int) -> list[int]:
    """Counts below ``threads`` the governor may use: 1, 2, 4, ..."""
    return [1 << i for i in range(threads.bit_length()) if 1 << i < threads]


def padding_probe(
    model: torch.nn.Module, rules: dict[int, LayerRules], invariance: BatchInvariance,
    device: torch.device, packed: bool = False,
) -> Callable[[], RowPadding]:
    """The row-padding probe of ``model`` at the current thread count."""
    linears: list[torch.Tensor | LinearProduct] = []
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            linears.append(module.weight)
        elif isinstance(module, PackedLinear) and (
                packed or module.weight.dtype != torch.float32):
            # taken now: kept past release; bfloat16 packed products are probed always (the
            # float32 ones were measured exact at every row count)
            linears.append(LinearProduct.of(module))
    widths = {r.k_dim for r in rules.values()}  # rotary tables
    return lambda: invariance.row_padding(linears, device, widths=widths)


#: Why a runner whose linear layers had to be packed is not exact (see
#: :func:`exact_row_padding`).
PREFILL_ATTENTION_ON_MKL = (
    "MKL's products depend on a call's size on this machine (its AVX2 path on an AVX-512 "
    "CPU, or an MKL_CBWR mode): the linear layers run packed and decode steps are exact, "
    "but attention over a prefill step's prompts runs on MKL, so a prompt's first token "
    "may differ alone and beside other prompts")


def exact_row_padding(
    model: torch.nn.Module, rules: dict[int, LayerRules], invariance: BatchInvariance,
    device: torch.device, dtype: torch.dtype,
) -> tuple[RowPadding, Callable[[], RowPadding]]:
    """The row padding of ``model``; where MKL's rows cannot be exact, packed and probed again."""
    probe = padding_probe(model, rules, invariance, device)
    padding = probe()
    if not padding.exact and packed_linear.can_pack(device, dtype):
        count = packed_linear.pack_linears(model)
        probe = padding_probe(model, rules, invariance, device, packed=True)
        packed = probe()
        padding_logger.info("row padding: no padding makes MKL's products exact on this "
                            "machine: %d linear layers packed (oneDNN or panels)", count)
        padding = packed if not packed.exact else RowPadding(
            packed.targets, packed.multiple, packed.widths, packed.chunk, exact=False,
            reason=PREFILL_ATTENTION_ON_MKL)
    if not padding.exact:
        padding_logger.warning("row padding: %s: a request's logits may depend on its "
                               "batch-mates in the last bits", padding.reason)
    return padding, probe


def thread_governor(
    device: torch.device, threads: int | None, probe: Callable[[], list[torch.Tensor]],
    padding: RowPadding | None = None, probe_padding: Callable[[], RowPadding] | None = None,
) -> ThreadGovernor | None:
    """A :class:`ThreadGovernor` for the CPU forward, or None where the count stays fixed; it
    probes each candidate count, so call it on the worker thread at load."""
    if device.type != "cpu" or threads is None or threads < 2 \
            or os.environ.get("AIOSERVE_NUM_THREADS"):
        return None
    try:
        meter = LoadMeter(affinity_cpus())
    except OSError as error:
        logger.info("CPU threads fixed at %d: cannot measure the load (%s)", threads, error)
        return None
    try:
        want = probe()
    except ValueError as error:  # too few KV blocks to probe
        logger.info("CPU threads fixed at %d: %s", threads, error)
        meter.close()
        return None
    counts = [threads]
    try:
        for count in _candidates(threads):
            torch.set_num_threads(count)
            same = all(torch.equal(a, b) for a, b in zip(want, probe(), strict=True))
            if same and (padding is None or probe_padding is None
                         or probe_padding().targets == padding.targets):
                counts.append(count)
    finally:
        torch.set_num_threads(threads)
    if len(counts) == 1:
        logger.info("CPU threads fixed at %d: fewer threads change the logits' bits", threads)
        meter.close()
        return None
    return ThreadGovernor(counts, meter, torch.set_num_threads)


def choose_forward(
    name: str, model: torch.nn.Module, backend: AttentionBackend,
    rules: dict[int, LayerRules], auto_lean: bool,
    probe: Callable[[lean_llama.LeanLlama | None], list[torch.Tensor]],
) -> tuple[lean_llama.LeanLlama | None, str]:
    """The forward ``name`` asks for and why (``"auto"``: lean where it is bit-exact)."""
    if name == "transformers":
        return None, "transformers"
    if name == "lean-llama":
        return lean_llama.lean_forward(model, backend, rules, probe), "lean-llama"
    plain = all(layer.plain for layer in rules.values())
    if not (auto_lean and plain and lean_llama.supports(model)):
        return None, "transformers (auto: the lean forward does not apply here)"
    try:
        lean = lean_llama.lean_forward(model, backend, rules, probe)
    except ValueError as error:  # its logits differ, or too few KV blocks to probe
        reason = str(error).removeprefix("forward: ").split(";")[0]
        return None, f"transformers (auto: {reason})"
    return lean, "lean-llama (auto: its logits equal transformers' bit for bit)"


def probe_steps(
    run_model: Callable[..., torch.Tensor], num_kv_blocks: int, block_size: int,
    vocab_size: int, device: torch.device,
) -> list[torch.Tensor]:
    """Logits of two probe steps on KV blocks 0-3 (ValueError for fewer blocks)."""
    if num_kv_blocks < 4:
        raise ValueError("forward: lean-llama's load check needs at least 4 KV blocks")
    table = np.array([[0, 1], [2, 3]], dtype=np.int64)
    first = np.array([min(7, 2 * block_size - 1), min(4, 2 * block_size - 1)])
    logits = []
    for starts, counts in ((np.zeros(2, np.int64), first), (first, np.ones(2, np.int64))):
        ids = torch.arange(int(counts.sum()), device=device) * 7 % vocab_size
        keep = torch.from_numpy(np.cumsum(counts) - 1).to(device)
        logits.append(run_model(ids, starts, counts, table, keep))
    return logits
