"""The runner's set-up decisions: device, dtype, context length, EOS ids, memory, threads."""

from __future__ import annotations

import os

import torch
from transformers import GenerationConfig

from aioserve.runners.model import loader as model_loader

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``"auto"`` picks CUDA when present, else the CPU.

    Raises:
        ValueError: CUDA asked for where this torch build or machine has none.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "has no CUDA support" if torch.version.cuda is None else "sees no CUDA device"
        raise ValueError(f"device {name!r}: this torch ({torch.__version__}) {build}; "
                         "use --device cpu or auto")
    return device


def context_length(requested: int | None, text_config: object) -> int:
    """The context length in tokens: ``requested`` or the model's
    ``max_position_embeddings``.

    Raises:
        ValueError: ``requested`` exceeds what the model was built for (as vLLM refuses
            it); UnsupportedModelError: neither is known.
    """
    if requested is None:
        return model_loader.context_length(text_config)
    model_len = getattr(text_config, "max_position_embeddings", None)
    if model_len is not None and requested > int(model_len):
        raise ValueError(f"max_model_len: {requested} exceeds the model's context of "
                         f"{int(model_len)} tokens (max_position_embeddings)")
    return requested


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``"auto"`` is bfloat16 on CUDA and float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def eos_token_ids(model_path: str, generation_config: GenerationConfig | None) -> tuple[int, ...]:
    """End-of-sequence ids from the model's generation config (int or list)."""
    eos = generation_config.eos_token_id if generation_config is not None else None
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def free_memory_bytes(device: torch.device) -> int:
    """Free memory of ``device`` in bytes: the GPU's free memory, or the RAM available
    to new allocations on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def env_count(name: str) -> int | None:
    """A positive integer from the environment variable ``name`` (None when unset).

    Raises:
        ValueError: the value is not a positive integer (the message names the variable).
    """
    value = os.environ.get(name)
    if not value:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def cpu_threads(device: torch.device) -> int | None:
    """Intra-op threads of the forward: ``AIOSERVE_NUM_THREADS``, else on the CPU every
    core (``os.cpu_count()``). Off the CPU: ``AIOSERVE_NUM_THREADS`` or None (torch's own
    setting).

    Every core pays for small models too once one thread does all the compute (see
    :class:`~aioserve.runners.worker.torch_runner.TorchRunner`): on the 2-core box the test
    model (292,800 parameters) went from about 2,300 output tokens/s on one thread to
    about 2,900 on two (64-request workload, three alternations).

    Raises:
        ValueError: ``AIOSERVE_NUM_THREADS`` is not a positive integer.
    """
    budget = env_count("AIOSERVE_NUM_THREADS")
    if device.type != "cpu" or budget is not None:
        return budget
    return os.cpu_count() or 1
