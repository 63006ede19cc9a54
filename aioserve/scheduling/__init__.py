"""The scheduler plugin contract (version 3): a read-only view of the engine in, a
decision out, feedback after every step.

A policy decides; the engine owns every queue and block and checks each decision
(unknown ids are ignored, budgets and KV blocks are enforced), so a faulty policy
cannot corrupt state, and one that raises is contained (:mod:`.guard`). See
``docs/schedulers.md``.

It never imports the runners, the server or a concrete policy (``schedulers/``): the
registry finds policies by name.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve
    never at module level: torch, numpy, transformers
"""

from aioserve.scheduling.decision import NO_DECISION, SchedulerOutput
from aioserve.scheduling.feedback import StepFeedback
from aioserve.scheduling.policy import CONTRACT_VERSION, OrderedScheduler, Scheduler
from aioserve.scheduling.state import NO_HIT, Admission, PrefixHit, SchedulerState
from aioserve.scheduling.view import RequestView

__all__ = [
    "CONTRACT_VERSION",
    "NO_DECISION",
    "NO_HIT",
    "Admission",
    "OrderedScheduler",
    "PrefixHit",
    "RequestView",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerState",
    "StepFeedback",
]
