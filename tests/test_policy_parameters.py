"""A literature policy's parameter of the wrong type or range is refused when the policy is
loaded (before any model loads), by a message that names that parameter."""

from __future__ import annotations

from typing import Any

import pytest

from aioserve.scheduling.registry import load_scheduler

BAD = [
    ("vtc", {"prompt_weight": -1}, "prompt_weight"),
    ("vtc", {"output_weight": float("inf")}, "output_weight"),
    ("vtc", {"weights": {"light": 0}}, "weights['light']"),
    ("vtc", {"weights": {"light": "x"}}, "'weights'"),
    ("vtc", {"preempt": "maybe"}, "'preempt'"),
    ("priority", {"low_share": 1.0}, "low_share"),
    ("priority", {"low_share": "a"}, "'low_share'"),
    ("edf", {"default_ttft_ms": 0}, "default_ttft_ms"),
    ("edf", {"default_tpot_ms": -5}, "default_tpot_ms"),
    ("edf", {"late_delay_s": -1}, "late_delay_s"),
    ("edf", {"deadline_margin": 0.5}, "deadline_margin"),
    ("mlfq", {"levels": 0}, "levels"),
    ("mlfq", {"quantum": 1.5}, "'quantum'"),
    ("mlfq", {"prefill_tokens_per_iteration": 0}, "prefill_tokens_per_iteration"),
    ("mlfq", {"batch_size": 0}, "batch_size"),
    ("mlfq", {"promote_after_s": -2}, "promote_after_s"),
    ("mlfq", {"max_evictions": -1}, "max_evictions"),
    ("mlfq", {"evict_gap": 0}, "evict_gap"),
    ("mlfq", {"evict_margin": 0.5}, "evict_margin"),
    ("mlfq", {"promote_share": 1.5}, "promote_share"),
]


@pytest.mark.parametrize(("spec", "params", "named"), BAD,
                         ids=[f"{s}-{next(iter(p))}" for s, p, _ in BAD])
def test_a_bad_parameter_is_refused_by_name(spec: str, params: dict[str, Any], named: str):
    with pytest.raises(ValueError) as refused:
        load_scheduler(spec, params)
    message = str(refused.value)
    assert message.startswith(f"scheduler {spec!r}") and named in message, message
    others = {"levels", "quantum", "batch_size", "default_ttft_ms", "default_tpot_ms",
              "prompt_weight", "output_weight"} - {named.strip("'")}
    assert not any(name in message for name in others), message  # only the bad one
