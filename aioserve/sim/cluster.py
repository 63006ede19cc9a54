"""N simulated replicas behind a router, advanced in time order on one virtual clock.

Each replica is the single-replica simulator's engine (its own core, policy, KV cache and
runner); events run in time order: a step end on one replica, or an arrival, routed by the
router from every replica's load at that instant (after the step ends before it) and queued
at the chosen replica's next step boundary, as ``simulate`` queues it. Arrivals of one
instant are all routed before an idle replica starts, so one replica reproduces
``simulate`` exactly."""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aioserve.engine.observation import ListenerHub
from aioserve.engine.output import Delivery
from aioserve.request import Request
from aioserve.routing.registry import load_router
from aioserve.routing.router import ReplicaLoad, Router, RouteRequest, prompt_block_hashes
from aioserve.runners.base import RunnerOutput, ScheduledBatch
from aioserve.sim.runner import OverlappedRunner, SimulatedRunner
from aioserve.sim.simulator import (
    SimConfig,
    SimResult,
    _Arrivals,
    _replica,
    _SimStepLoop,
    precedes,
)
from aioserve.workloads.request import FIRST_WORD_ID, WorkloadRequest

__all__ = ["ClusterResult", "simulate_cluster"]


@dataclass
class ClusterResult:
    """A cluster run: each replica's ``SimResult`` (its ``workload``: the requests routed
    to it, in arrival order) and where each request went."""

    router: str
    scheduler: str
    config: SimConfig
    workload: list[WorkloadRequest]
    replicas: list[SimResult]
    placement: dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"ClusterResult({self.router!r}, {self.replicas!r})"


class _Gate:
    """Lets the earliest step end run, once every replica waits on one or is idle."""

    def __init__(self, count: int, arrivals: deque[WorkloadRequest]) -> None:
        self.arrivals = arrivals  # not yet routed
        self.ends: list[tuple[int, int, asyncio.Future[None]]] = []
        self.running = count
        self.idle: set[int] = set()
        self.changed = asyncio.Event()

    def _stopped(self) -> None:
        self.running -= 1
        if self.running == 0:
            self.changed.set()

    def is_next(self, index: int, end_ns: int) -> bool:
        """Whether this step end is the next event: every other replica waits on a later
        one or is idle, and no arrival comes first (then it runs without waiting)."""
        if self.running != 1 or (self.ends and self.ends[0][:2] < (end_ns, index)):
            return False
        return not (self.arrivals and precedes(self.arrivals[0], end_ns))

    async def wait(self, index: int, end_ns: int) -> None:
        if not self.is_next(index, end_ns):
            await self.turn(index, end_ns)

    def turn(self, index: int, end_ns: int) -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self.ends, (end_ns, index, future))
        self._stopped()
        return future

    def went_idle(self, index: int) -> None:
        self.idle.add(index)
        self._stopped()

    def resume(self, index: int | None = None) -> None:
        """Let the earliest step end (or the idle replica ``index``) go on."""
        self.running += 1
        self.changed.clear()
        if index is None:
            heapq.heappop(self.ends)[2].set_result(None)
        else:
            self.idle.discard(index)


class _GatedRunner(SimulatedRunner):
    gate: _Gate
    index: int

    async def step(self, batch: ScheduledBatch) -> RunnerOutput:
        end = self.now_ns + self.step_cost_ns(batch)
        await self.gate.wait(self.index, end)
        self._end_step(end)
        await asyncio.sleep(0)
        return self.outputs(batch)


class _GatedOverlappedRunner(OverlappedRunner):
    gate: _Gate
    index: int

    async def _finish(self, batch: ScheduledBatch, end_ns: int) -> RunnerOutput:
        await self.gate.wait(self.index, end_ns)
        return await super()._finish(batch, end_ns)


class _ReplicaLoop(_SimStepLoop):
    gate: _Gate
    index: int

    async def wait_for_work(self) -> None:
        self.gate.went_idle(self.index)
        await super().wait_for_work()


class _Queue(_Arrivals):
    """A replica's arrivals, counting what was sent to it and has not ended."""

    def __init__(self, result: SimResult) -> None:
        super().__init__(result)
        self.weights: dict[str, int] = {}
        self.tokens = 0
        chained = result.core.on_finish

        def finished(request: Request) -> None:
            if chained is not None:
                chained(request)
            self.ended(request.request_id)

        result.core.on_finish = finished

    def send(self, item: WorkloadRequest, prompt: list[int]) -> None:
        self.result.workload.append(item)
        self.pending.append(item)
        self.prompts[item.id] = prompt
        self.weights[item.id] = weight = item.prompt_len + item.cap(
            self.result.core.max_model_len)
        self.tokens += weight

    def ended(self, request_id: str) -> None:
        self.tokens -= self.weights.pop(request_id, 0)

    def submit(self, item: WorkloadRequest) -> None:
        super().submit(item)
        if item.id in self.result.rejected:
            self.ended(item.id)

    def load(self) -> ReplicaLoad:
        blocks = self.result.core.blocks
        return ReplicaLoad(len(self.weights), self.tokens, blocks.num_free_blocks,
                           blocks.num_blocks)


async def simulate_cluster(
    workload: list[WorkloadRequest],
    replicas: int = 2,
    router: str | Router = "round_robin",
    scheduler: str = "fcfs",
    config: SimConfig | None = None,
    router_params: Mapping[str, Any] | None = None,
    scheduler_params: Mapping[str, Any] | None = None,
) -> ClusterResult:
    """Run ``workload`` on ``replicas`` simulated engines behind ``router``.

    Args:
        workload: the requests (ids unique).
        replicas: how many engines (>= 1), each with ``config`` and its own ``scheduler``.
        router: a router name, ``"package.module:Class"`` or an instance (fresh per run).
        scheduler: the policy of every replica (a name or ``"package.module:Class"``).
        router_params, scheduler_params: constructor parameters.

    Raises:
        ValueError: ``replicas`` < 1, an unknown router or scheduler, bad parameters, a
            ``max_concurrency``, or a router choosing no replica.
        SimulationStalled: a replica stopped making progress."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    config = config or SimConfig()
    if config.max_concurrency is not None:
        raise ValueError("max_concurrency: a client's limit, not a replica's; not simulated "
                         "over replicas")
    chooser = load_router(router, router_params)
    kind = _GatedOverlappedRunner if config.overlap else _GatedRunner
    pending: deque[WorkloadRequest] = deque()  # filled once the policies are made
    gate = _Gate(replicas, pending)
    results, arrivals, loops = [], [], []
    for index in range(replicas):
        result = _replica(workload, scheduler, config, None, None, scheduler_params, kind)
        result.workload = []
        queue = _Queue(result)
        runner = result.runner
        assert isinstance(runner, (_GatedRunner, _GatedOverlappedRunner))
        runner.gate, runner.index = gate, index
        runner.on_clock = queue.at_boundary
        loop = _ReplicaLoop(result.core, runner, Delivery(), ListenerHub())
        loop.gate, loop.index = gate, index
        results.append(result)
        arrivals.append(queue)
        loops.append(loop)
    pending.extend(sorted(workload, key=lambda r: (r.arrival_ns, r.after_start)))
    name = router if isinstance(router, str) else getattr(chooser, "name", type(chooser).__name__)
    cluster = ClusterResult(name, results[0].scheduler, config, list(workload), results)
    vocab = results[0].runner.vocab_size
    max_model_len = results[0].core.max_model_len

    def route(item: WorkloadRequest) -> int:
        prompt = item.prompt_token_ids(vocab, FIRST_WORD_ID)
        request = RouteRequest(item.id, item.prompt_len, item.cap(max_model_len),
                               prompt_block_hashes(prompt, config.block_size),
                               config.block_size, item.meta)
        index = chooser.choose(request, [queue.load() for queue in arrivals])
        if not isinstance(index, int) or not 0 <= index < replicas:
            raise ValueError(f"router {name!r} chose {index!r}, not a replica 0..{replicas - 1}")
        cluster.placement[item.id] = index
        arrivals[index].send(item, prompt)
        return index

    tasks = [asyncio.create_task(loop.run(), name=f"aioserve-sim-replica-{i}")
             for i, loop in enumerate(loops)]
    for task in tasks:
        task.add_done_callback(lambda _task: gate.changed.set())
    try:
        while True:
            while gate.running:
                await gate.changed.wait()
                for task in tasks:
                    if task.done():
                        task.result()  # raises what stopped the loop
                        raise RuntimeError("a replica's step loop ended")
            end = gate.ends[0][0] if gate.ends else None
            if pending and (end is None or precedes(pending[0], end)):
                instant, woken = pending[0].arrival_ns, []
                while (pending and pending[0].arrival_ns == instant
                       and (end is None or precedes(pending[0], end))):
                    index = route(pending.popleft())
                    if index in gate.idle and index not in woken:
                        woken.append(index)
                for index in woken:
                    gate.resume(index)
                    arrivals[index].when_idle(results[index].runner)
                    loops[index].wakeup.set()
            elif end is not None:
                gate.resume()
            else:
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            result.core.close()
    return cluster
