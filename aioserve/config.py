"""Engine configuration: one frozen dataclass, validated when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to know before it starts.

    Attributes:
        model: local directory or hub id of a transformers causal LM.
        tokenizer: tokenizer directory or hub id; defaults to ``model``.
        scheduler: a registered policy name (``"fcfs"``, ``"static"``, …) or
            ``"package.module:Class"``.
        scheduler_config: the policy's parameters (a dict with string keys), checked
            when the engine starts.
        max_num_seqs: most requests running at once (slots).
        max_num_batched_tokens: most tokens (prefill + decode) in one step; longer
            prompts are prefilled in chunks.
        block_size: tokens per KV-cache block.
        num_kv_blocks: KV-cache size in blocks; ``None`` sizes it from
            ``kv_cache_memory_bytes``.
        kv_cache_memory_bytes: memory budget for the KV cache in bytes, used when
            ``num_kv_blocks`` is None. The cache never holds more blocks than
            ``max_num_seqs * max_model_len`` tokens need.
        kv_cache_memory_fraction: when set (0 < f <= 1), the KV budget is this fraction
            of the device's free memory when the engine starts (GPU: free device
            memory; CPU: available RAM), instead of ``kv_cache_memory_bytes``.
        max_model_len: context length in tokens; ``None`` reads the model config.
        dtype: ``"auto"`` (bfloat16 on CUDA; on the CPU the checkpoint's bfloat16 where the
            CPU runs it natively, else float32: ``runners/torch/setup.resolve_dtype``),
            ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda[:N]"``.
        seed: seed of the sampler used by requests that give no seed of their own.
        enable_prefix_caching: reuse the KV blocks of prefixes already computed (vLLM's
            automatic prefix caching).
        attention_backend: the attention implementation behind the runner's seam
            (``"reference"``: exact on any device).
        enforce_eager: never capture CUDA graphs (else captured for decode steps on CUDA
            when the attention backend supports them).
        batch_invariant: a request's greedy tokens in any batch equal its tokens alone
            (on by default; off saves the padding it takes on the CPU, see
            :mod:`aioserve.runners.batch_invariance`).
        forward: ``"transformers"`` (the model's own), ``"lean-llama"`` (Llama: the same
            arithmetic in fewer Python calls, checked bit for bit at load) or ``"auto"``
            (lean-llama on the CPU with the reference backend when it checks, else
            transformers).
        max_waiting: most requests waiting for a slot (preempted ones included); one
            more is refused at once with :class:`~aioserve.errors.QueueFullError` (HTTP
            429). None: no limit, the engine's default (an embedded or offline engine
            queues all it is given); ``aioserve serve`` sets
            :func:`~aioserve.engine.admission.default_max_waiting`
            (``DEFAULT_WAITING_BATCHES`` x ``max_num_seqs``) unless told otherwise (see
            :mod:`aioserve.engine.admission`).
        max_queue_time_s: seconds a request may wait before it is first scheduled; then
            it ends with :class:`~aioserve.errors.QueueTimeoutError` (HTTP 429) and
            frees its place. None: no limit.

    Raises:
        ValueError: a field is out of range; the message names the field.
    """

    model: str
    tokenizer: str | None = None
    scheduler: str = "fcfs"
    scheduler_config: dict[str, Any] | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 4096
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 4 * 1024**3
    kv_cache_memory_fraction: float | None = None
    max_model_len: int | None = None
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    enable_prefix_caching: bool = True
    attention_backend: str = "reference"
    forward: str = "auto"
    enforce_eager: bool = False
    batch_invariant: bool = True
    max_waiting: int | None = None
    max_queue_time_s: float | None = None

    def __post_init__(self) -> None:
        positive = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
        }
        if self.num_kv_blocks is not None:
            positive["num_kv_blocks"] = self.num_kv_blocks
        if self.max_model_len is not None:
            positive["max_model_len"] = self.max_model_len
        if self.max_waiting is not None:
            positive["max_waiting"] = self.max_waiting
        for name, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive integer, got {value!r}")
        queue_time = self.max_queue_time_s
        if queue_time is not None and (isinstance(queue_time, bool) or not isinstance(
                queue_time, (int, float)) or not queue_time > 0):
            raise ValueError(
                f"EngineConfig.max_queue_time_s must be > 0 seconds, got {queue_time!r}")
        fraction = self.kv_cache_memory_fraction
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(
                f"EngineConfig.kv_cache_memory_fraction must be in (0, 1], got {fraction!r}")
        params = self.scheduler_config
        if params is not None and (
            not isinstance(params, dict) or not all(isinstance(k, str) for k in params)
        ):
            raise ValueError("EngineConfig.scheduler_config must be a dict with string keys, "
                             f"got {params!r}")
        if not self.model:
            raise ValueError("EngineConfig.model must name a model directory or hub id")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"EngineConfig.dtype must be auto/float32/bfloat16/float16, got {self.dtype!r}"
            )
        if self.forward not in ("auto", "transformers", "lean-llama"):
            raise ValueError(f"EngineConfig.forward must be auto, transformers or lean-llama, "
                             f"got {self.forward!r}")
        if not (self.device in ("auto", "cpu") or self.device.startswith("cuda")):
            raise ValueError(
                f"EngineConfig.device must be auto, cpu or cuda[:N], got {self.device!r}"
            )
