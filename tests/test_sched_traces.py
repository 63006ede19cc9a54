"""Each built-in policy keeps its promise on both shipped traces at 0.9x and 1.2x
capacity (tests/trace_promises.py: the setting and the promises; small windows here, the
full scale in benchmarks/lab/policy_promises.py; the table in docs/policies-on-traces.md)."""

from __future__ import annotations

import pytest
from trace_promises import POLICIES, PROMISES, TRACES, capacity, config, figures, kept, window

from aioserve.scheduling.registry import load_scheduler
from aioserve.sim.simulator import simulate

#: requests per window (about 20 s of traffic at capacity)
N = 300
_capacity: dict[str, float] = {}


@pytest.mark.parametrize("load", [0.9, 1.2])
@pytest.mark.parametrize("trace", sorted(TRACES))
async def test_every_policy_keeps_its_promise_on_the_trace(trace, load):
    if trace not in _capacity:
        _capacity[trace] = await capacity(trace, N)
    workload = window(trace, N, load * _capacity[trace])
    fcfs = figures(await simulate(workload, "fcfs", config(trace)))
    broken = {}
    for name in POLICIES:
        got = figures(await simulate(workload, load_scheduler(name), config(trace)))
        assert got["finished"] == fcfs["finished"] == N
        if not kept(name, got, fcfs):
            figure = PROMISES[name][0]
            broken[name] = (PROMISES[name][1], got[figure], fcfs[figure])
    assert broken == {}
