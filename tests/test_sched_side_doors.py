"""No side door to the true length: a policy that reads every public and private attribute
reachable from its RequestViews and SchedulerState learns nothing a server would not know.

Two runs differ only in the requests' true (hidden) lengths; everything a snooping policy
can reach before any step runs must be the same in both, so it learns 0 true lengths.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.scheduling import RequestView, SchedulerOutput, SchedulerState
from aioserve.sim.runner import OverlappedRunner
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest
from schedulers.fcfs import FCFSScheduler

LEAVES = (int, float, str, bool, bytes, type(None))


def reachable(obj: Any, path: str = "", depth: int = 10,
              seen: set[int] | None = None) -> Iterator[tuple[str, Any]]:
    """Every (path, value) of a plain value reachable from ``obj`` through attributes
    (``__dict__`` and ``__slots__``, private ones included), containers, closures'
    cells and bound methods' ``__self__``."""
    seen = set() if seen is None else seen
    if isinstance(obj, LEAVES):
        yield path, obj
        return
    if depth == 0 or id(obj) in seen or isinstance(obj, (type, types.ModuleType)):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from reachable(value, f"{path}[{key!r}]", depth - 1, seen)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        for i, value in enumerate(items):
            yield from reachable(value, f"{path}[{i}]", depth - 1, seen)
        return
    if isinstance(obj, types.MethodType):
        yield from reachable(obj.__self__, f"{path}.__self__", depth - 1, seen)
        return
    if isinstance(obj, types.FunctionType):
        for i, cell in enumerate(obj.__closure__ or ()):
            yield from reachable(cell.cell_contents, f"{path}.<cell {i}>", depth - 1, seen)
        return
    names = set(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        names.update(getattr(klass, "__slots__", ()))
    for name in sorted(names):
        try:
            value = getattr(obj, name)
        except AttributeError:
            continue
        yield from reachable(value, f"{path}.{name}", depth - 1, seen)


class Snoop(FCFSScheduler):
    """fcfs that records everything reachable from each new view and the first state."""

    name = "snoop"

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, list[tuple[str, Any]]] = {}
        self.first: list[tuple[str, Any]] | None = None

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        self.seen[request.request_id] = list(reachable(request, "view"))

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        if self.first is None:
            self.first = list(reachable(state, "state"))
        return super().schedule(state)


def learnt(a: Snoop, b: Snoop) -> int:
    """Requests whose observations differ between two runs that differ only in lengths."""
    differ = sum(a.seen[k] != b.seen[k] for k in a.seen)
    return differ + (a.first != b.first)


CAP = 40


def workload(lengths: list[int]) -> list[WorkloadRequest]:
    return [WorkloadRequest(f"r{i}", 0.0, 8, n, max_tokens=CAP) for i, n in enumerate(lengths)]


async def test_the_simulator_tells_a_policy_nothing_of_the_true_length():
    # one step ahead (every --profile run): a request whose true length equals its cap
    # must look like any other (it had params.ignore_eos set)
    short, capped = [10, 20, 30, 5], [CAP] * 4
    runs = []
    for lengths in (short, capped):
        policy = Snoop()
        await simulate(workload(lengths), policy, SimConfig(slots=2, overlap=True, step_ms=10))
        runs.append(policy)
    assert len(runs[0].seen) == 4 and runs[0].first
    assert learnt(*runs) == 0


async def test_the_engine_tells_a_policy_nothing_of_the_hidden_stop():
    runs = []
    for lengths in ([3, 5, 7, 9], [9, 7, 5, 3]):
        policy = Snoop()
        runner = OverlappedRunner({}, step_ms=10, num_kv_blocks=64, block_size=16)
        engine = AsyncEngine(EngineConfig(model="<sim>", max_num_seqs=2), runner=runner,
                             scheduler=policy)
        async with engine:
            streams = [engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=CAP), f"r{i}",
                                          stop_after=n) for i, n in enumerate(lengths)]
            for stream, n in zip(streams, lengths):
                while not (await stream.queue.get()).finished:
                    pass
                assert stream.request.num_output_tokens == n  # the hidden stop still works
        runs.append(policy)
    assert len(runs[0].seen) == 4
    assert learnt(*runs) == 0


class TenLines(FCFSScheduler):
    """The audit's policy: reads a hidden stop through the view's private request."""

    name = "ten-lines"

    def __init__(self) -> None:
        super().__init__()
        self.read: dict[str, Any] = {}

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        hidden = getattr(request._request, "stop_after", None)  # noqa: SLF001
        if hidden is not None:
            self.read[request.request_id] = hidden


async def test_the_audits_ten_line_policy_reads_no_hidden_stop():
    policy = TenLines()
    runner = OverlappedRunner({}, step_ms=10, num_kv_blocks=64, block_size=16)
    async with AsyncEngine(EngineConfig(model="<sim>"), runner=runner, scheduler=policy) as e:
        streams = [e.add_request([5, 6], SamplingParams(max_tokens=CAP), f"r{i}", stop_after=4)
                   for i in range(6)]
        for stream in streams:
            while not (await stream.queue.get()).finished:
                pass
    assert policy.read == {}
