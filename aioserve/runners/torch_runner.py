"""TorchRunner: any transformers causal LM, a paged KV cache, packed batches."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from aioserve.config import EngineConfig
from aioserve.runners import attention
from aioserve.runners.base import RunnerOutput, ScheduledBatch
from aioserve.runners.sampler import Sampler
from aioserve.runners.traced import TracedDecode, trace_enabled

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``"auto"`` picks CUDA when present, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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


def cpu_threads(device: torch.device) -> int | None:
    """Intra-op threads for the model on the CPU (None: leave torch's setting).

    ``AIOSERVE_NUM_THREADS`` wins; otherwise one core is left to the event loop (its
    bookkeeping runs while the worker computes), so 2 cores give 1 thread: tiny ops
    gain nothing from a second thread, and an OpenMP barrier waiting for a thread the
    OS descheduled costs milliseconds. ``torch.set_num_threads`` is process-wide; the
    runner restores the previous value on :meth:`TorchRunner.close`.
    """
    if device.type != "cpu":
        return None
    env = os.environ.get("AIOSERVE_NUM_THREADS")
    if env:
        return max(1, int(env))
    return max(1, min(torch.get_num_threads(), (os.cpu_count() or 2) - 1))


class TorchRunner:
    """Runs a transformers causal LM over packed batches with a paged KV cache.

    The KV cache is, per layer, K and V tensors of shape
    ``[num_kv_blocks * block_size, num_kv_heads, head_dim]`` (the model's dtype),
    indexed by the engine's block ids. The forward pass runs in one worker thread so
    the event loop stays free.

    Args:
        config: the engine configuration (model, dtype, device, cache size).

    Raises:
        OSError: the model cannot be loaded.
        ValueError: the KV-cache budget holds no block.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        local = config.model.startswith((".", "/", "~"))
        if local and not os.path.isdir(os.path.expanduser(config.model)):
            raise OSError(f"model directory {config.model!r} does not exist")
        name = attention.register()
        model = AutoModelForCausalLM.from_pretrained(
            config.model, dtype=self.dtype, attn_implementation=name
        )
        self.model = model.to(self.device).eval()
        text_config = model.config.get_text_config()
        self.max_model_len = config.max_model_len or int(text_config.max_position_embeddings)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.eos_token_ids = eos_token_ids(config.model, getattr(model, "generation_config", None))
        self.block_size = config.block_size
        self.num_kv_blocks = self._num_blocks(config, text_config)
        self.kv_caches = self._allocate_cache(text_config)
        self.sampler = Sampler(self.device, config.seed)
        self._forward_started = threading.Event()
        self.traced: TracedDecode | None = None
        if trace_enabled(self.device):
            traced = TracedDecode(self.model, self.kv_caches, self.block_size, self.device)
            self.traced = traced if traced.prepare() else None
        self.num_threads = cpu_threads(self.device)
        self._saved_threads = torch.get_num_threads()
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="aioserve-runner", initializer=self._init_thread
        )

    def _init_thread(self) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)

    def _kv_shape(self, text_config: object) -> tuple[int, int, int]:
        heads = text_config.num_attention_heads
        kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
        return text_config.num_hidden_layers, kv_heads, head_dim

    def kv_bytes_per_block(self, text_config: object) -> int:
        """Bytes one block takes over all layers (K and V)."""
        layers, kv_heads, head_dim = self._kv_shape(text_config)
        element = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * layers * kv_heads * head_dim * element * self.block_size

    def _num_blocks(self, config: EngineConfig, text_config: object) -> int:
        if config.num_kv_blocks is not None:
            return config.num_kv_blocks
        by_memory = config.kv_cache_memory_bytes // self.kv_bytes_per_block(text_config)
        by_need = -(-config.max_num_seqs * self.max_model_len // self.block_size)
        blocks = min(by_memory, by_need)
        if blocks <= 0:
            raise ValueError("EngineConfig.kv_cache_memory_bytes is too small for one KV block")
        return blocks

    def _allocate_cache(self, text_config: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
        layers, kv_heads, head_dim = self._kv_shape(text_config)
        shape = (self.num_kv_blocks * self.block_size, kv_heads, head_dim)
        return [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(layers)
        ]

    def submit(self, batch: ScheduledBatch) -> asyncio.Future[RunnerOutput]:
        """Start :meth:`execute` in the runner's worker thread now; returns its future
        (the engine does its bookkeeping while the step runs).

        With the traced decode step, the caller then waits (at most 2 ms, GIL released)
        until the worker has prepared its inputs and entered the forward, which runs
        without the GIL: otherwise the worker's first Python lines wait for the GIL
        behind the engine's fan-out (up to the 5 ms switch interval per hand-over).
        """
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self.execute, batch)
        if self.traced is not None:
            self._forward_started.wait(0.002)
            self._forward_started.clear()
        return future

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        """Run :meth:`execute` in the runner's worker thread."""
        return await self.submit(batch)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        """One forward pass over the packed batch, then sampling (blocking)."""
        self.sampler.release(batch.released_ids)
        if not batch.request_ids:
            return RunnerOutput(token_ids=[])
        counts = [len(t) for t in batch.token_ids]
        rows = [i for i, s in enumerate(batch.sample) if s]
        ends = np.cumsum(counts) - 1
        keep = torch.from_numpy(ends[rows] if rows else ends[:1]).to(self.device)
        if self.traced is not None and len(counts) == sum(counts):  # pure decode
            flat = [tokens[0] for tokens in batch.token_ids]
            args = self.traced.inputs(flat, batch.start_positions, batch.block_tables, keep)
            self._forward_started.set()
            logits = self.traced(*args)[0]
        else:
            args = None
            if self.traced is not None and self.traced.has_mixed:
                args = self.traced.mixed_inputs(
                    batch.token_ids, batch.start_positions, batch.block_tables, keep
                )
            self._forward_started.set()
            logits = self._forward(batch, counts, keep) if args is None else self.traced(*args)[0]
        tokens = [-1] * len(counts)
        if not rows:
            return RunnerOutput(token_ids=tokens)
        sampled, logprobs = self.sampler.sample(
            logits.float(),
            [batch.request_ids[i] for i in rows],
            [batch.sampling_params[i] for i in rows],
            [batch.penalty_token_ids[i] for i in rows],
        )
        per_request = [None] * len(counts) if logprobs is not None else None
        for row, token, index in zip(range(len(rows)), sampled, rows):
            tokens[index] = token
            if per_request is not None and logprobs is not None:
                per_request[index] = logprobs[row]
        return RunnerOutput(token_ids=tokens, logprobs=per_request)

    def _forward(
        self, batch: ScheduledBatch, counts: list[int], keep: torch.Tensor
    ) -> torch.Tensor:
        """The eager forward over a packed batch; logits ``[K, vocab]`` of the kept rows."""
        meta, positions = attention.build_metadata(
            self.kv_caches, batch.start_positions, counts, batch.block_tables,
            self.block_size, self.device,
        )
        flat = [token for tokens in batch.token_ids for token in tokens]
        input_ids = torch.tensor(flat, dtype=torch.int64, device=self.device).unsqueeze(0)
        return self.model(
            input_ids=input_ids,
            position_ids=positions.unsqueeze(0),
            use_cache=False,
            logits_to_keep=keep,
            paged_metadata=meta,
        ).logits[0]

    def close(self) -> None:
        """Stop the worker thread and restore torch's thread count."""
        self._executor.shutdown(wait=True)
        if self.num_threads is not None:
            torch.set_num_threads(self._saved_threads)
