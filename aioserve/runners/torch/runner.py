"""TorchRunner: any transformers causal LM, a paged KV cache, persistent batch state."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from aioserve.config import EngineConfig
from aioserve.outputs import TokenLogprob
from aioserve.runners.attention import layer_rules
from aioserve.runners.attention.backend import AttentionBackend
from aioserve.runners.attention.registry import backend_for, backend_serves
from aioserve.runners.base import ModelRunner, RunnerInfo, RunnerOutput, ScheduledBatch
from aioserve.runners.batch_invariance import BatchInvariance
from aioserve.runners.cpu import malloc as cpu_malloc
from aioserve.runners.cpu import native_kernels
from aioserve.runners.gpu.cuda_graphs import DecodeGraphs, model_decode_forward
from aioserve.runners.model import loader as model_loader
from aioserve.runners.model.lean_llama import LeanLlama
from aioserve.runners.torch.batch_sampler import BatchSampler, SampledBatch
from aioserve.runners.torch.input_batch import InputBatch, StepInputs
from aioserve.runners.torch.setup import (
    checkpoint_dtype,
    choose_forward,
    context_length,
    cpu_threads,
    eos_token_ids,
    exact_row_padding,
    num_kv_blocks,
    probe_steps,
    resolve_device,
    resolve_dtype,
    thread_governor,
)
from aioserve.startup_clock import PhaseClock


class PendingOutput:
    """A launched step's sampled tokens, until the host has them."""

    __slots__ = ("num_rows", "sample_rows", "sampled", "host")

    def __init__(
        self, num_rows: int, sample_rows: np.ndarray | None, sampled: SampledBatch | None,
        host: tuple[torch.Tensor, torch.cuda.Event] | None,
    ) -> None:
        self.num_rows = num_rows
        self.sample_rows = sample_rows
        self.sampled = sampled
        self.host = host

    def result(self) -> RunnerOutput:
        """Wait for this step's tokens (not later steps'); -1 for rows that did not sample."""
        tokens = [-1] * self.num_rows
        if self.sampled is None or self.sample_rows is None:
            return RunnerOutput(token_ids=tokens)
        logprobs: list[TokenLogprob | None] | None = None
        if self.host is not None and self.sampled.logprobs is None:
            buffer, event = self.host
            event.synchronize()
            sampled = buffer.tolist()
        else:
            sampled, row_logprobs = self.sampled.to_host()
            if row_logprobs is not None:
                logprobs = [None] * self.num_rows
                for row, entry in zip(self.sample_rows.tolist(), row_logprobs):
                    logprobs[row] = entry
        for row, token in zip(self.sample_rows.tolist(), sampled):
            tokens[row] = token
        return RunnerOutput(token_ids=tokens, logprobs=logprobs)


class TorchRunner(ModelRunner):
    """Runs a transformers causal LM over packed batches with a paged KV cache.

    Each layer's KV shape comes from its rules, found by one recording forward at load;
    per-request state persists in :class:`InputBatch`. The load and every step run in order on
    one worker thread (one OpenMP team), so the engine schedules step N+1 while N runs and N+1
    reads N's tokens on the device; on CUDA the tokens come back through pinned buffers waited
    for in a second thread.

    Raises:
        OSError: the model cannot be loaded.
        UnsupportedModelError: the model cannot be served exactly.
        ValueError: the KV budget holds no block, or an unknown or unfit attention backend."""

    overlaps = True

    def __init__(self, config: EngineConfig) -> None:
        # One thread does all the compute: load, load checks and every step (one OpenMP
        # team; docs/ARCHITECTURE.md, "Model forward", has the measurements).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aioserve-runner")
        try:
            self._executor.submit(self._load, config).result()
        except BaseException:
            self._executor.shutdown(wait=True)
            raise

    def _load(self, config: EngineConfig) -> None:
        clock = PhaseClock()  # its parts: self.load_times
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device, None if config.dtype != "auto"
                                   else checkpoint_dtype(config.model))
        self.invariance = BatchInvariance(config.batch_invariant)
        self.backend: AttentionBackend = backend_for(config.attention_backend, self.device,
                                                     config.forward, self.invariance)
        if self.device.type == "cpu":  # large temporaries reuse heap memory (cpu_malloc.py)
            cpu_malloc.tune_malloc()
        model, self.layer_rules = model_loader.load_model(
            config.model, self.dtype, self.device, self.backend
        )
        self.model = model
        clock.mark("model load")
        text_config = model.config.get_text_config()
        self.windows = tuple(sorted({r.window for r in self.layer_rules.values() if r.window}))
        self.max_model_len = context_length(config.max_model_len, text_config)
        embeddings: Any = model.get_input_embeddings()  # an nn.Embedding (or a subclass)
        self.vocab_size = int(embeddings.num_embeddings)
        self.eos_token_ids = eos_token_ids(getattr(model, "generation_config", None))
        self.block_size = config.block_size
        self.kv_block_bytes = model_loader.kv_bytes_per_token(self.layer_rules,
                                                              self.dtype) * self.block_size
        self.num_kv_blocks = num_kv_blocks(config, self.device, self.kv_block_bytes,
                                           self.max_model_len)
        graphs = self.device.type == "cuda" and hasattr(self.backend, "decode_metadata") \
            and not config.enforce_eager
        head_major = self.device.type == "cpu" and self.backend.head_major
        if self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16):
            native_kernels.available()  # loaded, or built in the background (switch: on_idle)
        self._kernels = native_kernels.KernelSwitch()
        clock.mark("native kernels")
        # small steps padded so a row's products do not depend on the step (row_padding.py)
        self.row_padding, probe_padding = exact_row_padding(
            model, self.layer_rules, self.invariance, self.device, self.dtype)
        clock.mark("row padding probe")
        # CUDA graphs' and row padding's rows write into one scratch block the engine
        # never sees
        self._scratch_block = self.num_kv_blocks
        scratch = int(graphs or self.row_padding.needed)
        self.kv_caches = model_loader.allocate_kv_cache(
            self.layer_rules, (self.num_kv_blocks + scratch) * self.block_size, self.dtype,
            self.device, head_major,
        )
        # Twice the slots: a request whose last token is in flight still holds its
        # state while the request admitted in its place arrives (overlapped scheduling).
        slots = 2 * config.max_num_seqs
        self.batch = InputBatch(slots, self.max_model_len, self.block_size, self.device)
        self.sampler = BatchSampler(slots, self.vocab_size, self.device, config.seed)
        self.num_threads = cpu_threads(self.device)
        self._saved_threads = torch.get_num_threads()
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        clock.mark("KV cache, batch state")
        self.lean, self.forward_note = choose_forward(
            config.forward, model, self.backend, self.layer_rules,
            head_major and backend_serves(config.attention_backend, "lean-llama"),
            self._probe)
        clock.mark("forward choice (probe)")
        self.governor = thread_governor(self.device, self.num_threads,
                                        lambda: self._probe(self.lean), self.row_padding,
                                        probe_padding)
        clock.mark("thread counts (probe)")
        self._waiter: ThreadPoolExecutor | None = None
        self._pinned: list[torch.Tensor] = []
        if self.device.type == "cuda":
            self._waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aioserve-wait")
            self._pinned = [torch.empty(slots, dtype=torch.int64, pin_memory=True)
                            for _ in range(2)]
        self._steps = 0
        self.graphs: DecodeGraphs | None = None
        if graphs:
            width = -(-self.max_model_len // self.block_size)
            self.graphs = DecodeGraphs(config.max_num_seqs, width, self.block_size,
                                       self.num_kv_blocks, self.device)
            self.graphs.capture(model_decode_forward(
                model, self.backend, self.kv_caches, self.block_size, self.windows))
        clock.mark("CUDA graphs")
        self.load_times = clock.parts

    def on_idle(self) -> bool:
        """Switch to the compiled kernels once built (True: switched)."""
        switched = self._kernels.idle()
        if switched and self.lean is not None:
            self.lean.native = self.device.type == "cpu" and self.dtype == torch.float32
        return switched

    @property
    def idle_poll_s(self) -> float | None:
        """1 while the compiled kernels build in the background, else None."""
        return 1.0 if self._kernels.pending else None

    def describe(self) -> RunnerInfo:
        """Device, dtype, forward, KV block bytes, threads now and load phases."""
        governor = self.governor
        threads = governor.threads if governor is not None else self.num_threads
        return RunnerInfo(str(self.device), str(self.dtype).removeprefix("torch."),
                          self.forward_note, self.kv_block_bytes, threads,
                          tuple(governor.counts) if governor is not None else (),
                          self.load_times)

    def submit(self, batch: ScheduledBatch) -> asyncio.Future[RunnerOutput]:
        """Queue the step on the worker thread and return at once."""
        loop = asyncio.get_running_loop()
        self._kernels.busy()
        if self._waiter is None:
            return loop.run_in_executor(self._executor, self.execute, batch)
        launched = loop.run_in_executor(self._executor, self.launch, batch)
        return asyncio.ensure_future(self._wait(launched))

    async def _wait(self, launched: asyncio.Future[PendingOutput]) -> RunnerOutput:
        pending = await launched
        assert self._waiter is not None
        return await asyncio.get_running_loop().run_in_executor(self._waiter, pending.result)

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        return await self.submit(batch)

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        return self.launch(batch).result()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> PendingOutput:
        """Apply the changes, run the forward and sample without waiting for the device."""
        if self.governor is not None:  # the team's size, on this (the worker) thread
            self.governor.tick()
        released, added = self.batch.apply(batch)
        for slot in released:
            self.sampler.remove(slot)
        for slot, new in added:
            self.sampler.add(slot, new.params, new.token_ids,
                             len(new.token_ids) - new.num_prompt_tokens)
        if not batch.request_ids:
            return PendingOutput(0, None, None, None)
        step = self.batch.inputs(batch)
        logits = self._forward(step)
        if not len(step.sample_rows):
            return PendingOutput(len(batch.request_ids), None, None, None)
        slot_list = step.slots[step.sample_rows].tolist()  # host data: no device sync
        sampled = self.sampler.sample(logits.float(), step.sample_slots, slot_list)
        self.batch.last_sampled[step.sample_slots] = sampled.token_ids
        host = None
        if self._pinned:
            self._steps += 1
            buffer = self._pinned[self._steps % 2][: len(step.sample_rows)]
            buffer.copy_(sampled.token_ids, non_blocking=True)
            host = (buffer, torch.cuda.Event())
            host[1].record()
        return PendingOutput(len(batch.request_ids), step.sample_rows, sampled, host)

    def _forward(self, step: StepInputs) -> torch.Tensor:
        """Logits ``[S, vocab]``: a CUDA graph's replay where one fits, else the forward."""
        graphs = self.graphs
        if graphs is not None and int(step.num_new_tokens.max()) == 1:
            rows = len(step.slots)
            tables = [list(row[: -(-(p + 1) // self.block_size)])
                      for row, p in zip(step.block_table.tolist(), step.start_positions.tolist())]
            plan = graphs.stage([0] * rows, step.start_positions.tolist(), tables)
            if plan is not None:  # the tokens come from the device (placeholders filled)
                graphs.static.input_ids[:rows].copy_(step.input_ids, non_blocking=True)
                return graphs.replay(plan).index_select(0, step.logits_index)
        return self._run_model(step.input_ids, step.start_positions, step.num_new_tokens,
                               step.block_table, step.logits_index, self.lean)

    def _run_model(
        self, input_ids: torch.Tensor, starts: np.ndarray, counts: np.ndarray,
        block_table: np.ndarray, keep: torch.Tensor, lean: LeanLlama | None,
    ) -> torch.Tensor:
        """Logits ``[len(keep), vocab]``; a small step runs padded (see ``row_padding``)."""
        num_kept = len(keep)
        extra = self.row_padding.padded(len(input_ids)) - len(input_ids)
        if extra:  # one-token sequences at position 0 of the scratch block
            input_ids = torch.cat((input_ids, input_ids.new_zeros(extra)))
            starts = np.concatenate((starts, np.zeros(extra, np.int64)))
            counts = np.concatenate((counts, np.ones(extra, np.int64)))
            block_table = np.concatenate((block_table, np.full(
                (extra, block_table.shape[1]), self._scratch_block, np.int64)))
        extra_kept = self.row_padding.padded(num_kept) - num_kept
        if extra_kept:
            keep = torch.cat((keep, keep[-1:].expand(extra_kept)))
        meta, positions = self.backend.build_metadata(
            self.kv_caches, starts, counts, block_table, self.block_size, self.device,
            self.windows,
        )
        if lean is not None:
            return lean.forward(input_ids, positions, keep, meta)[:num_kept]
        with layer_rules.metadata_context(meta):  # for models that drop kwargs (stablelm)
            logits: torch.Tensor = self.model(
                input_ids=input_ids.unsqueeze(0),
                position_ids=positions.unsqueeze(0),
                use_cache=False,
                logits_to_keep=keep,
                paged_metadata=meta,
            ).logits[0, :num_kept]
        return logits

    @torch.inference_mode()
    def _probe(self, lean: LeanLlama | None) -> list[torch.Tensor]:
        return probe_steps(functools.partial(self._run_model, lean=lean), self.num_kv_blocks,
                           self.block_size, self.vocab_size, self.device)

    def close(self) -> None:
        """Stop the threads (idempotent), restoring the worker's thread count first."""
        self._kernels.close()
        if self.num_threads is not None:
            with contextlib.suppress(RuntimeError):  # closed before: no new work accepted
                self._executor.submit(torch.set_num_threads, self._saved_threads).result()
        self._executor.shutdown(wait=True)
        if self.governor is not None:
            self.governor.close()
        if self._waiter is not None:
            self._waiter.shutdown(wait=True)
