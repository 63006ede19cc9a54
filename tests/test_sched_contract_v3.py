"""Contract v3: on_preempt, hooks that receive the state snapshot, v1/v2 hooks still
called without it, and --scheduler-config keys that name the policies of a run."""

from __future__ import annotations

from typing import ClassVar

import pytest

from aioserve.commands.simulate import policy_params
from aioserve.scheduling import (
    CONTRACT_VERSION,
    OrderedScheduler,
    RequestView,
    SchedulerState,
    StepFeedback,
)
from aioserve.scheduling.registry import params_by_policy
from aioserve.sim.simulator import SimConfig, simulate
from aioserve.workloads.request import WorkloadRequest


class Witness(OrderedScheduler):
    """FCFS that writes down each hook with what its state showed."""

    name: ClassVar[str] = "witness"

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, str, bool]] = []

    def _saw(self, hook: str, request: RequestView, state: SchedulerState) -> None:
        waiting = any(r.request_id == request.request_id for r in state.waiting)
        self.events.append((hook, request.request_id, request.status, waiting))

    def on_arrival(self, request: RequestView, state: SchedulerState) -> None:
        self._saw("arrival", request, state)

    def on_preempt(self, request: RequestView, state: SchedulerState) -> None:
        self._saw("preempt", request, state)

    def on_finish(self, request: RequestView, state: SchedulerState) -> None:
        self._saw("finish", request, state)

    def on_step(self, feedback: StepFeedback, state: SchedulerState) -> None:
        assert state.step == feedback.step + 1  # the snapshot after the step


class OldHooks(OrderedScheduler):
    """Hooks as contract versions 1 and 2 wrote them: no state."""

    name: ClassVar[str] = "old_hooks"

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_arrival(self, request: RequestView) -> None:  # type: ignore[override]
        self.count += 1

    def on_finish(self, request: RequestView) -> None:  # type: ignore[override]
        self.count += 1

    def on_step(self, feedback: StepFeedback) -> None:  # type: ignore[override]
        self.count += 1


def memory_bound() -> list[WorkloadRequest]:
    return [WorkloadRequest(f"r{i}", 0.0, 40, 60) for i in range(6)]


async def test_hooks_see_the_snapshot_after_their_event_and_preemption_is_reported():
    policy = Witness()
    result = await simulate(memory_bound(), policy, SimConfig(slots=6, kv_blocks=24))
    assert CONTRACT_VERSION >= 3 and result.core.guard.failures == 0
    preempts = [e for e in policy.events if e[0] == "preempt"]
    assert len(preempts) == result.preemptions > 0
    assert all(status == "waiting" and waiting for _, _, status, waiting in preempts)
    arrivals = [e for e in policy.events if e[0] == "arrival"]
    assert len(arrivals) == 6 and all(waiting for *_, waiting in arrivals)
    finishes = [e for e in policy.events if e[0] == "finish"]
    assert len(finishes) == 6 and not any(waiting for *_, waiting in finishes)


async def test_version_2_hooks_run_unchanged():
    policy = OldHooks()
    result = await simulate(memory_bound(), policy, SimConfig(slots=6, kv_blocks=24))
    assert result.core.guard.failures == 0
    assert policy.count == 12 + len(result.steps)


def test_config_keyed_by_spec_or_name():
    names = ["fcfs", "schedulers.vtc:VTCScheduler"]
    keyed = policy_params('{"vtc": {"preempt": false}}', names)
    assert keyed == {"fcfs": None, "schedulers.vtc:VTCScheduler": {"preempt": False}}
    shared = policy_params('{"watermark": 0.05}', names)
    assert shared == dict.fromkeys(names, {"watermark": 0.05})


def test_config_keyed_by_the_one_policy_of_a_command():
    assert params_by_policy(["vtc"], {"vtc": {"preempt": False}}) == {"vtc": {"preempt": False}}
    weights = {"weights": {"a": 3}}  # a parameter whose value is an object
    assert params_by_policy(["vtc"], weights) == {"vtc": weights}
    with pytest.raises(ValueError, match=r"'fcfs' has no parameter 'weights', and one object "
                       r"applies to every policy of this run \(fcfs, vtc\); key it by policy: "
                       r'\{"vtc": \{"weights": \{"a": 3\}\}\}'):
        params_by_policy(["fcfs", "vtc"], weights)  # fcfs refused it later, unexplained
    assert params_by_policy(["fcfs", "vtc"], {"watermark": 0.02}) == {
        "fcfs": {"watermark": 0.02}, "vtc": {"watermark": 0.02}}


def test_config_key_that_names_no_policy_says_which_exist():
    with pytest.raises(ValueError, match=r"'vtcc'.*fcfs, vtc"):
        policy_params('{"vtcc": {"preempt": false}}', ["fcfs", "vtc"])
