"""A TorchRunner computes on one thread of its own: the model's load, the lean
forward's load check and every step.

With OpenMP, each thread that opens a parallel region gets its own team of workers;
once a process holds more of them than there are cores, libgomp stops them spinning
between regions and a step pays kernel wake-ups thousands of times (see
:class:`~aioserve.runners.torch.runner.TorchRunner`). So no compute may happen on the
constructing thread or the event loop's.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.runners.model import loader as model_loader
from aioserve.runners.torch.runner import TorchRunner


@pytest.fixture
def compute_threads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(what, thread id) of every model load and forward, recorded as they run."""
    seen: list[tuple[str, int]] = []
    load, run_model = model_loader.load_model, TorchRunner._run_model

    def spy_load(*args, **kwargs):
        seen.append(("load", threading.get_ident()))
        return load(*args, **kwargs)

    def spy_run_model(self, *args, **kwargs):
        seen.append(("forward", threading.get_ident()))
        return run_model(self, *args, **kwargs)

    monkeypatch.setattr(model_loader, "load_model", spy_load)
    monkeypatch.setattr(TorchRunner, "_run_model", spy_run_model)
    return seen


async def test_load_check_and_steps_share_one_thread_that_is_not_the_callers(
    model_dir: str, compute_threads: list[tuple[str, int]]
) -> None:
    config = EngineConfig(model=model_dir, device="cpu", forward="lean-llama",
                          num_kv_blocks=64, max_num_seqs=4)
    runner = TorchRunner(config)  # built on this (the event loop's) thread
    loaded = len(compute_threads)
    assert loaded >= 3  # the load and the lean forward's two probe steps
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    async with AsyncEngine(config, runner=runner) as engine:
        outs = [o async for o in engine.generate([1, 300, 400], params)]
    assert outs[-1].finished and outs[-1].num_output_tokens == 5
    kinds = [kind for kind, _ in compute_threads]
    assert kinds[0] == "load" and kinds[loaded:].count("forward") >= 5
    threads = {ident for _, ident in compute_threads}
    assert len(threads) == 1
    assert threading.get_ident() not in threads


def test_thread_count_defaults_to_every_usable_core_and_honours_the_variable(monkeypatch):
    from aioserve.runners.cpu.threads.cpu_budget import usable_cpus
    from aioserve.runners.torch.setup import cpu_threads

    cpu = torch.device("cpu")
    monkeypatch.delenv("AIOSERVE_NUM_THREADS", raising=False)
    # every core this process may use (affinity, cgroup quota: tests/test_cpu_budget.py)
    assert cpu_threads(cpu) == usable_cpus() <= (os.cpu_count() or 1)
    assert cpu_threads(torch.device("meta")) is None  # off the CPU: torch's own setting
    monkeypatch.setenv("AIOSERVE_NUM_THREADS", "3")
    assert cpu_threads(cpu) == 3


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_thread_count_is_a_value_error_naming_the_variable(model_dir, monkeypatch, value):
    monkeypatch.setenv("AIOSERVE_NUM_THREADS", value)
    with pytest.raises(ValueError, match="AIOSERVE_NUM_THREADS"):
        TorchRunner(EngineConfig(model=model_dir, device="cpu", num_kv_blocks=8))
