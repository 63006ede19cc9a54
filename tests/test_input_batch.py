"""The runner's persistent batch: a step's input ids come from the known tokens or, for
a decoding request, from its slot's last sampled token (still on the device)."""

from __future__ import annotations

import numpy as np
import torch

from aioserve.runners.base import NewRequest, ScheduledBatch
from aioserve.runners.torch.input_batch import InputBatch
from aioserve.sampling_params import SamplingParams


def _admit(batch: InputBatch, prompts: dict[str, list[int]]) -> None:
    new = [NewRequest(rid, tokens, len(tokens), SamplingParams(max_tokens=8), [i], 0)
           for i, (rid, tokens) in enumerate(prompts.items())]
    batch.apply(ScheduledBatch([], [], [], [], [], new_requests=new))


def _step(ids: list[str], counts: list[int], starts: list[int]) -> ScheduledBatch:
    return ScheduledBatch(ids, counts, starts, [True] * len(ids), [0] * len(ids))


def test_a_decode_only_step_reads_every_input_from_the_slots_last_sampled_tokens():
    batch = InputBatch(4, 64, 16, torch.device("cpu"))
    _admit(batch, {"a": [5, 6, 7], "b": [8, 9], "c": [3]})
    slots = {rid: batch.requests[rid].slot for rid in "abc"}
    batch.last_sampled[torch.tensor([slots["a"], slots["b"], slots["c"]])] = torch.tensor(
        [101, 102, 103])
    # batch order differs from slot order: each row must read its own slot
    inputs = batch.inputs(_step(["c", "a", "b"], [1, 1, 1], [1, 3, 2]))
    assert inputs.input_ids.tolist() == [103, 101, 102]
    assert inputs.slots.tolist() == [slots["c"], slots["a"], slots["b"]]
    assert inputs.logits_index.tolist() == [0, 1, 2]


def test_a_mixed_step_feeds_prompt_tokens_and_sampled_tokens_in_packed_order():
    batch = InputBatch(4, 64, 16, torch.device("cpu"))
    _admit(batch, {"a": [5, 6, 7], "b": [8, 9, 10, 11]})
    batch.last_sampled[batch.requests["a"].slot] = 42
    # a decodes its sampled token; b prefills positions 1..3 of its prompt
    inputs = batch.inputs(_step(["a", "b"], [1, 3], [3, 1]))
    assert inputs.input_ids.tolist() == [42, 9, 10, 11]
    assert inputs.logits_index.tolist() == [0, 3]
    assert np.array_equal(inputs.num_new_tokens, [1, 3])
