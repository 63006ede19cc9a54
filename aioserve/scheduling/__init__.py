"""The scheduler plugin contract (1.0, docs/schedulers.md)."""

from aioserve.scheduling.decision import NO_DECISION, SchedulerOutput
from aioserve.scheduling.feedback import StepFeedback
from aioserve.scheduling.policy import CONTRACT_VERSION, OrderedScheduler, PolicyReport, Scheduler
from aioserve.scheduling.state import NO_HIT, Admission, PrefixHit, SchedulerState
from aioserve.scheduling.view import RequestView

__all__ = [
    "CONTRACT_VERSION",
    "NO_DECISION",
    "NO_HIT",
    "Admission",
    "OrderedScheduler",
    "PolicyReport",
    "PrefixHit",
    "RequestView",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerState",
    "StepFeedback",
]
