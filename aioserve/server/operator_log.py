"""What ``aioserve serve`` tells its operator on stderr: a start-up summary and a stats
line at most every ``interval`` seconds while the engine works."""

from __future__ import annotations

import logging

from aioserve.engine import AsyncEngine
from aioserve.engine.observation import StepSnapshot, scheduler_name
from aioserve.errors import EngineNotRunningError
from aioserve.request import Request
from aioserve.runners.base import ModelRunner, RunnerInfo
from aioserve.scheduling.parameters import configuration_text, policy_configuration
from aioserve.startup_clock import PhaseClock, describe

logger = logging.getLogger("aioserve.serve")


def format_bytes(n: float) -> str:
    """``n`` bytes for people: ``1.50 GiB``, ``12.0 MiB``, ``512 B``."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if n < 10 * size else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def startup_summary(engine: AsyncEngine, served_name: str | None = None) -> str:
    """One line per setting of a started engine (model, served name, device, dtype,
    context, slots, KV blocks, policy, threads, admission limit); EngineNotRunningError
    before start."""
    core = engine.core
    if core is None or not engine.is_running:
        raise EngineNotRunningError("start the engine before summarising it")
    config = engine.config
    info = engine.runner_info()
    blocks, block_size = core.blocks.num_blocks, core.blocks.block_size
    block_bytes = info.kv_block_bytes
    memory = f", {format_bytes(blocks * block_bytes)}" if block_bytes else ""
    budget = (f"{config.kv_cache_memory_fraction:.0%} of free memory"
              if config.kv_cache_memory_fraction is not None
              else format_bytes(config.kv_cache_memory_bytes))
    if config.num_kv_blocks is not None:
        budget = "--num-kv-blocks"
    forward = info.forward or config.forward
    policy = configuration_text(policy_configuration(core.scheduler, config.scheduler_config))
    served = (("served as", f"{served_name}  (the \"model\" clients send)"),) if served_name else ()
    rows = (
        ("model", config.model),
        *served,
        ("device", info.device or "n/a"),
        ("dtype", info.dtype or "n/a"),
        ("context length", f"{core.max_model_len} tokens"),
        ("slots", f"{core.max_num_seqs} (max_num_seqs), "
                  f"{core.max_num_batched_tokens} tokens per step"),
        ("KV cache", f"{blocks} blocks x {block_size} tokens = {blocks * block_size} tokens"
                     f"{memory} (budget: {budget})"),
        ("scheduler", f"{scheduler_name(core.scheduler)} {policy}"),
        ("forward", forward),
        ("threads", thread_line(info)),
        ("admission", admission_line(config.max_waiting, config.max_queue_time_s)),
    )
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def admission_line(max_waiting: int | None, max_queue_time_s: float | None) -> str:
    """The summary's admission line: the limits past which a request gets 429."""
    waiting = "no limit" if max_waiting is None else f"{max_waiting} waiting"
    queue_time = "none" if max_queue_time_s is None else f"{max_queue_time_s:g} s"
    return f"429 past {waiting} (--max-waiting), queue time limit {queue_time}"


def thread_line(info: RunnerInfo) -> str:
    """The summary's threads line: the count in use and how it is chosen."""
    threads, choices = info.threads, info.thread_choices
    if choices:
        counts = ", ".join(map(str, choices))
        return (f"{threads} intra-op thread(s), of {choices[-1]} usable CPU(s); "
                f"fewer while other processes take the CPUs (may use {counts})")
    if threads is None:
        return "torch's default"
    return f"{threads} intra-op thread(s), fixed"


def startup_line(process_s: float | None, clock: PhaseClock, runner: ModelRunner | None) -> str:
    """Seconds from the process's start to ready, and their parts."""
    parts = dict(clock.parts)
    load_times = runner.describe().load_times if runner is not None else {}
    if "engine start" in parts and load_times:
        parts["tokenizer, engine"] = max(0.0, parts.pop("engine start") - sum(load_times.values()))
        parts.update(load_times)
    if process_s is not None:
        parts = {"python, CLI imports": process_s, **parts}
    return f"ready in {sum(parts.values()):.2f} s: {describe(parts)}"


class StatsLogger:
    """An engine listener logging ``running, waiting, KV %, tokens/s`` at most once per
    ``interval`` seconds of busy engine time (idle spells left out of the rates)."""

    def __init__(self, engine: AsyncEngine, interval: float = 10.0) -> None:
        self.engine = engine
        self.interval = interval
        self._last: StepSnapshot | None = None

    def attach(self) -> None:
        """Start logging."""
        self.engine.add_listener(self, step_interval=self.interval)

    def detach(self) -> None:
        """Stop logging."""
        self.engine.remove_listener(self)

    def on_step(self, snapshot: StepSnapshot) -> None:
        """Engine listener: log a line once ``interval`` seconds of busy time have
        passed since the last."""
        last = self._last
        if last is None:
            self._last = snapshot
            return
        idle = snapshot.idle_s - last.idle_s
        busy = snapshot.time - last.time - idle
        if busy < self.interval or snapshot.step == last.step:
            return
        rate = (snapshot.num_generated_tokens - last.num_generated_tokens) / busy
        running = sum(s is not None for s in snapshot.slots)
        kv = snapshot.kv_used_blocks / snapshot.kv_total_blocks
        idle_part = f", idle {idle:.1f} s" if idle >= 0.05 else ""
        logger.info(
            "running: %d reqs, waiting: %d reqs, KV cache: %.1f%%, generation: %.1f tokens/s "
            "(last %.1f s busy%s: %d steps, %d preemptions)", running, snapshot.num_waiting,
            100 * kv, rate, busy, idle_part, snapshot.step - last.step,
            snapshot.num_preemptions - last.num_preemptions)
        self._last = snapshot

    def on_finish(self, request: Request) -> None:
        """Unused."""
