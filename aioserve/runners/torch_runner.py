"""TorchRunner: any transformers causal LM, a paged KV cache, packed batches."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all

import torch
from transformers import GenerationConfig

from aioserve.config import EngineConfig
from aioserve.runners import layer_rules, model_loader, step_split
from aioserve.runners.attention_backend import AttentionBackend, ReferenceBackend
from aioserve.runners.base import RunnerOutput, ScheduledBatch
from aioserve.runners.sampler import Sampler
from aioserve.runners.step_split import StartLatch, StepPart
from aioserve.runners.traced import TracedDecode, trace_enabled

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


class TorchRunner:
    """Runs a transformers causal LM over packed batches with a paged KV cache.

    The KV cache is, per layer, K ``[num_kv_blocks * block_size, kv_heads, k_dim]`` and
    V ``[..., kv_heads, v_dim]`` (the model's dtype), indexed by the engine's block ids
    and shaped from each layer's own rules, found by one recording forward at load
    (:func:`~aioserve.runners.layer_rules.discover`). The forward pass runs in a worker thread so
    the event loop stays free; on the CPU with the traced forward, a big enough step
    is cut into parts that run side by side in their own threads
    (:mod:`~aioserve.runners.step_split`).

    Attributes:
        step_parts: most parts a step is cut into (1: never cut).
        num_threads: intra-op threads of each part's forward (None: torch's setting).

    Args:
        config: the engine configuration (model, dtype, device, cache size).

    Raises:
        OSError: the model cannot be loaded.
        UnsupportedModelError: the model cannot be served exactly (ALiBi, layers that
            bypass transformers' attention interface, rules the backend lacks).
        ValueError: the KV-cache budget holds no block.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        local = config.model.startswith((".", "/", "~"))
        if local and not os.path.isdir(os.path.expanduser(config.model)):
            raise OSError(f"model directory {config.model!r} does not exist")
        self.backend: AttentionBackend = ReferenceBackend()
        model, self.layer_rules = model_loader.load_model(
            config.model, self.dtype, self.device, self.backend
        )
        self.model = model
        text_config = model.config.get_text_config()
        self.windows = tuple(sorted({r.window for r in self.layer_rules.values() if r.window}))
        self.max_model_len = context_length(config.max_model_len, text_config)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.eos_token_ids = eos_token_ids(config.model, getattr(model, "generation_config", None))
        self.block_size = config.block_size
        self.kv_block_bytes = self.kv_bytes_per_block()
        self.num_kv_blocks = self._num_blocks(config)
        self.kv_caches = model_loader.allocate_kv_cache(
            self.layer_rules, self.num_kv_blocks * self.block_size, self.dtype, self.device
        )
        self.sampler = Sampler(self.device, config.seed)
        self._started = StartLatch()
        self.traced: TracedDecode | None = None
        plain = all(rules.plain for rules in self.layer_rules.values())
        if trace_enabled(self.device) and plain:  # the traces carry no layer rules
            traced = TracedDecode(self.model, self.kv_caches, self.block_size, self.device)
            self.traced = traced if traced.prepare() else None
        self.step_parts, self.num_threads = step_split.cpu_layout(
            self.device, can_split=self.traced is not None
        )
        self._saved_threads = torch.get_num_threads()
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="aioserve-runner", initializer=self._init_thread
        )
        self._helpers: ThreadPoolExecutor | None = None
        if self.step_parts > 1:
            self._helpers = ThreadPoolExecutor(
                max_workers=self.step_parts - 1, thread_name_prefix="aioserve-runner-part",
                initializer=self._init_thread,
            )

    def _init_thread(self) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)

    def kv_bytes_per_block(self) -> int:
        """Bytes one block takes over all layers (K and V, each layer's own widths)."""
        return model_loader.kv_bytes_per_token(self.layer_rules, self.dtype) * self.block_size

    def _num_blocks(self, config: EngineConfig) -> int:
        if config.num_kv_blocks is not None:
            return config.num_kv_blocks
        budget = config.kv_cache_memory_bytes
        if config.kv_cache_memory_fraction is not None:
            budget = int(free_memory_bytes(self.device) * config.kv_cache_memory_fraction)
        by_memory = budget // self.kv_block_bytes
        by_need = -(-config.max_num_seqs * self.max_model_len // self.block_size)
        blocks = min(by_memory, by_need)
        if blocks <= 0:
            raise ValueError("EngineConfig.kv_cache_memory_bytes is too small for one KV block")
        return blocks

    def submit(self, batch: ScheduledBatch) -> asyncio.Future[RunnerOutput]:
        """Prepare the step's inputs here, then start it in the runner's threads; returns
        its future (the engine does its bookkeeping while the step runs).

        The inputs are built on the calling thread, while the runner's threads are idle,
        rather than in them while the caller's fan-out holds the GIL; every part is
        started from here. With the traced forward the caller then waits (at most 2 ms,
        GIL released) until the last part has entered its forward, which runs without
        the GIL: otherwise a part's first Python lines wait behind the fan-out (up to
        the 5 ms switch interval).
        """
        loop = asyncio.get_running_loop()
        try:
            parts = self.plan(batch)
        except Exception as exc:  # reported through the future, like a failed forward
            failed: asyncio.Future[RunnerOutput] = loop.create_future()
            failed.set_exception(exc)
            return failed
        traced_parts = sum(part.traced_args is not None for part in parts)
        self._started.reset(traced_parts)
        others = self._start_helpers(parts)
        future = loop.run_in_executor(self._executor, self.execute, batch, parts, others)
        if traced_parts:
            self._started.wait(0.002)
        return future

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        """Run :meth:`execute` in the runner's worker threads."""
        return await self.submit(batch)

    def plan(self, batch: ScheduledBatch) -> list[StepPart]:
        """The step's parts with their prepared inputs: one part, or on the CPU with
        the traced forward, a big enough step cut in parts of about equal work (see
        :mod:`~aioserve.runners.step_split`)."""
        if not batch.request_ids:
            return []
        groups = None
        if self._helpers is not None:
            counts = [len(t) for t in batch.token_ids]
            groups = step_split.split_rows(counts, batch.start_positions, self.step_parts)
        return [
            StepPart.of(batch, rows, self.traced, self.device)
            for rows in groups or [list(range(len(batch.request_ids)))]
        ]

    def _start_helpers(self, parts: list[StepPart]) -> list[Future[torch.Tensor]]:
        """Start every part but the first in the helper threads."""
        if len(parts) < 2:
            return []
        assert self._helpers is not None
        return [self._helpers.submit(self._forward_part, part) for part in parts[1:]]

    @torch.inference_mode()
    def execute(
        self, batch: ScheduledBatch, parts: list[StepPart] | None = None,
        others: list[Future[torch.Tensor]] | None = None,
    ) -> RunnerOutput:
        """One step: the forward of each part (side by side), then sampling (blocking).

        Args:
            batch: the step.
            parts: its :meth:`plan` (made here when None).
            others: the futures of ``parts[1:]`` already started in the helper
                threads (started here when None).
        """
        if parts is None:
            parts = self.plan(batch)
        if others is None:
            others = self._start_helpers(parts)
        self.sampler.release(batch.released_ids)
        if not parts:
            return RunnerOutput(token_ids=[])
        try:
            first = self._forward_part(parts[0])
        finally:  # even a failed step ends only when every part has (they share the cache)
            wait_all(others)
        logits = [first, *(future.result() for future in others)]
        tokens = [-1] * len(batch.request_ids)
        rows = [i for i, sample in enumerate(batch.sample) if sample]
        if not rows:
            return RunnerOutput(token_ids=tokens)
        merged = step_split.merge_logits([p.rows for p in parts], logits, batch.sample)
        sampled, logprobs = self.sampler.sample(
            merged.float(),
            [batch.request_ids[i] for i in rows],
            [batch.sampling_params[i] for i in rows],
            [batch.penalty_token_ids[i] for i in rows],
        )
        per_request = [None] * len(tokens) if logprobs is not None else None
        for row, token, index in zip(range(len(rows)), sampled, rows):
            tokens[index] = token
            if per_request is not None and logprobs is not None:
                per_request[index] = logprobs[row]
        return RunnerOutput(token_ids=tokens, logprobs=per_request)

    @torch.inference_mode()
    def _forward_part(self, part: StepPart) -> torch.Tensor:
        """Logits ``[k, vocab]`` of one part's kept rows: its traced forward, or the
        eager one (signalling :meth:`submit` before a traced forward starts)."""
        if part.traced_args is None:
            return self._forward(part)
        self._started.arrive()
        return self.traced(*part.traced_args)[0]  # type: ignore[misc]

    def _forward(self, part: StepPart) -> torch.Tensor:
        """The eager forward over a part; logits ``[K, vocab]`` of its kept rows."""
        meta, positions = self.backend.build_metadata(
            self.kv_caches, part.start_positions, [len(t) for t in part.token_ids],
            part.block_tables, self.block_size, self.device, self.windows,
        )
        flat = [token for tokens in part.token_ids for token in tokens]
        input_ids = torch.tensor(flat, dtype=torch.int64, device=self.device).unsqueeze(0)
        with layer_rules.metadata_context(meta):  # for models that drop kwargs (stablelm)
            return self.model(
                input_ids=input_ids,
                position_ids=positions.unsqueeze(0),
                use_cache=False,
                logits_to_keep=part.keep,
                paged_metadata=meta,
            ).logits[0]

    def close(self) -> None:
        """Stop the worker threads and restore torch's thread count."""
        self._executor.shutdown(wait=True)
        if self._helpers is not None:
            self._helpers.shutdown(wait=True)
        if self.num_threads is not None:
            torch.set_num_threads(self._saved_threads)
