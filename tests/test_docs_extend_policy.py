"""Issue 34, item 6: docs/schedulers.md's example of extending a built-in policy runs as
written (imported from ``schedulers.priority``, subclassed), and an ``OrderedScheduler``
serves the smallest key first, ties in queue order, as the docs say."""

from __future__ import annotations

import re
from pathlib import Path

from aioserve.request_meta import RequestMeta
from aioserve.scheduling import OrderedScheduler
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest

DOCS = Path(__file__).resolve().parents[1] / "docs" / "schedulers.md"


def first_started(result) -> list[str]:
    return sorted(result.finished, key=lambda rid: result.finished[rid].metrics.first_token_time)


async def test_the_docs_subclass_of_a_built_in_policy_serves_gold_first():
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    [code] = [b for b in blocks if "class GoldFirst" in b]
    assert "from schedulers.priority import PriorityScheduler" in code
    namespace: dict = {}
    exec(code, namespace)
    workload = [WorkloadRequest(f"r{i}", 0.0, 4, 4, meta=RequestMeta(tenant=tenant))
                for i, tenant in enumerate(["a", "b", "gold", "a", "gold"])]
    result = await simulate(workload, namespace["GoldFirst"](low_share=0.2),
                            SimConfig(slots=1))
    assert first_started(result) == ["r2", "r4", "r0", "r1", "r3"]


class ByPromptLength(OrderedScheduler):
    def key(self, request, state):
        return request.num_prompt_tokens


async def test_an_ordered_scheduler_serves_the_smallest_key_first_ties_in_arrival_order():
    lengths = [9, 3, 6, 3, 12]
    workload = [WorkloadRequest(f"r{i}", 0.0, n, 2) for i, n in enumerate(lengths)]
    result = await simulate(workload, ByPromptLength(), SimConfig(slots=1))
    assert first_started(result) == ["r1", "r3", "r2", "r0", "r4"]
