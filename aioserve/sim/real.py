"""Replay a simulator workload on a real, in-process engine (``simulate --real``): the same
JSONL, prompts and figures, on the engine's clock; each request sends its cap as
``max_tokens`` and ends at its length by ``stop_after`` (EOS ignored), which no policy sees."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from aioserve.engine import AsyncEngine
from aioserve.engine.admission import refusal_reason
from aioserve.errors import AdmissionError
from aioserve.request import Request
from aioserve.sampling_params import SamplingParams
from aioserve.scheduling import Scheduler, StepFeedback
from aioserve.sim.simulator import (
    SimConfig,
    SimResult,
    StepRecord,
    load_policy,
)
from aioserve.workloads.request import FIRST_WORD_ID, WorkloadRequest


def sim_config_of(engine: AsyncEngine, **overrides: Any) -> SimConfig:
    """The :class:`SimConfig` of a running engine, one step ahead as the engine runs, with
    ``overrides`` of its fields (a calibrated ``cost_model``)."""
    core = engine._require_core()
    return replace(SimConfig(
        slots=core.max_num_seqs, kv_blocks=core.blocks.num_blocks,
        block_size=core.blocks.block_size, max_num_batched_tokens=core.max_num_batched_tokens,
        enable_prefix_caching=core.blocks.enable_caching, max_model_len=core.max_model_len,
        overlap=True, max_waiting=core.admission.max_waiting,
        max_queue_time_s=core.admission.max_queue_time_s), **overrides)


class _Recorder:

    def __init__(self) -> None:
        self.finished: dict[str, Request] = {}
        self.feedback: list[StepFeedback] = []

    def on_step(self, snapshot: object) -> None:
        """A listener without step snapshots."""

    def on_finish(self, request: Request) -> None:
        self.finished[request.request_id] = request

    def on_feedback(self, feedback: StepFeedback) -> None:
        self.feedback.append(feedback)


async def _one(engine: AsyncEngine, item: WorkloadRequest, at: float, vocab_size: int,
               unix_zero: float, rejected: dict[str, str]) -> None:
    loop = asyncio.get_running_loop()
    delay = at + item.arrival_s - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
    params = SamplingParams(max_tokens=item.cap(engine._require_core().max_model_len),
                            temperature=0.0, ignore_eos=True, length_hint=item.length_hint)
    prompt = item.prompt_token_ids(vocab_size, FIRST_WORD_ID)
    try:
        stream = engine.add_request(prompt, params, item.id, meta=item.meta_from(unix_zero),
                                    stop_after=item.output_len)
    except ValueError as exc:
        rejected[item.id] = str(exc)
        return
    except AdmissionError as exc:  # the waiting queue is full
        rejected[item.id] = refusal_reason(exc)
        return
    try:
        while True:
            out = await stream.queue.get()
            if isinstance(out, BaseException):
                rejected[item.id] = (refusal_reason(out) if isinstance(out, AdmissionError)
                                     else str(out))
                return
            if out.finished:
                return
    finally:
        engine.release(stream)


async def replay(
    engine: AsyncEngine,
    workload: list[WorkloadRequest],
    scheduler: str | Scheduler,
    scheduler_params: Mapping[str, Any] | None = None,
) -> SimResult:
    """Run ``workload`` on a running, idle ``engine`` under ``scheduler``; returns what
    :func:`~aioserve.sim.simulator.simulate` returns, from the engine's real steps. The
    policy is replaced (and kept); the prefix cache is emptied first.

    Raises:
        ValueError: unknown scheduler or bad parameters.
        RuntimeError: the engine is busy."""
    core = engine._require_core()
    if core.has_work:
        raise RuntimeError("replay needs an idle engine")
    policy, name = load_policy(scheduler, scheduler_params, workload)
    core.set_policy(policy)
    engine.reset_prefix_cache()
    recorder = _Recorder()
    engine.add_listener(recorder, step_interval=None)
    core.step_observers.append(recorder.on_feedback)
    preemptions_before = core.num_preemptions
    preempted_tokens_before = core.num_preempted_tokens
    rejected: dict[str, str] = {}
    vocab = engine.runner.vocab_size if engine.runner is not None else 512
    try:
        loop = asyncio.get_running_loop()
        at, unix_zero = loop.time() + 0.05, time.time() + 0.05
        await asyncio.gather(*(_one(engine, item, at, vocab, unix_zero, rejected)
                               for item in workload))
    finally:
        engine.remove_listener(recorder)
        core.step_observers.remove(recorder.on_feedback)
    result = SimResult(name, sim_config_of(engine), list(workload), core,
                       engine.runner, policy=policy)  # type: ignore[arg-type]
    zero = at  # the workload's zero on the engine's clock (both are time.monotonic)
    result.finished = {k: _shifted(r, zero) for k, r in recorder.finished.items()
                       if k not in rejected}
    result.rejected = rejected
    result.feedback = [_shifted_step(s, zero) for s in recorder.feedback]
    result.steps = [StepRecord(s.start_time, s.end_time, s.request_ids, s.num_tokens)
                    for s in result.feedback]
    result.num_preemptions = core.num_preemptions - preemptions_before
    result.num_preempted_tokens = core.num_preempted_tokens - preempted_tokens_before
    return result


def _shifted(request: Request, zero: float) -> Request:
    """The request's times moved so the workload's zero is 0 (as in the simulator)."""
    m = request.metrics
    for name in ("arrival_time", "first_scheduled_time", "first_token_time",
                 "last_token_time", "finished_time"):
        value = getattr(m, name)
        if value is not None:
            setattr(m, name, value - zero)
    request.arrival_time -= zero
    return request


def _shifted_step(step: StepFeedback, zero: float) -> StepFeedback:
    return replace(step, start_time=step.start_time - zero, end_time=step.end_time - zero)
