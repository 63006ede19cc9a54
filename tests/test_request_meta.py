"""RequestMeta and workload files: every field's bad values are refused naming it."""

from __future__ import annotations

import json

import pytest

from aioserve import RequestMeta
from aioserve.workloads.request import WorkloadRequest, dump_jsonl, load_jsonl


@pytest.mark.parametrize(("field", "value"), [
    ("priority", 1.5), ("priority", True), ("priority", 2**63), ("priority", "high"),
    ("tenant", ""), ("tenant", "x" * 257), ("tenant", 7),
    ("ttft_slo_ms", 0), ("ttft_slo_ms", -1), ("ttft_slo_ms", float("nan")),
    ("ttft_slo_ms", "fast"), ("tpot_slo_ms", float("inf")), ("deadline", -5),
    ("deadline", True), ("metadata", {"k": 1}), ("metadata", {"": "v"}),
    ("metadata", {f"k{i}": "v" for i in range(17)}), ("metadata", {"k" * 65: "v"}),
    ("metadata", {"k": "v" * 513}), ("metadata", ["k", "v"]),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError) as info:
        RequestMeta(**{field: value})
    assert str(info.value).startswith(field)


def test_good_values_and_read_only_metadata():
    meta = RequestMeta(priority=-2, tenant="acme", ttft_slo_ms=250, tpot_slo_ms=40.5,
                       deadline=1.8e9, metadata={"team": "search", "tier": ""})
    assert meta.metadata == {"team": "search", "tier": ""}
    with pytest.raises(TypeError):
        meta.metadata["team"] = "ads"  # type: ignore[index]
    assert RequestMeta() == RequestMeta(0, None, None, None, None, {})


def test_workload_file_fields_round_trip_and_bad_lines_name_the_field(tmp_path):
    items = [WorkloadRequest("a", 0.5, 8, 20, deadline_s=4.0, max_tokens=64, length_hint=18,
                             meta=RequestMeta(3, "t", 200, 30, metadata={"k": "v"})),
             WorkloadRequest("b", 0.7, 40, 5, prefix_blocks=(7, 9), block_tokens=16)]
    assert load_jsonl(dump_jsonl(items, tmp_path / "w.jsonl")) == items
    for line, field in [({"arrival_s": 0, "prompt_len": 4, "output_len": 2}, "id"),
                        ({"id": "x", "arrival_s": 0, "prompt_len": 4, "output_len": 2,
                          "priority": "high"}, "priority"),
                        ({"id": "x", "arrival_s": 0, "prompt_len": 4, "output_len": 2,
                          "tenant": ""}, "tenant"),
                        ({"id": "x", "arrival_s": 0, "prompt_len": 4, "output_len": 9,
                          "max_tokens": 3}, "max_tokens"),
                        ({"id": "x", "arrival_s": 0, "prompt_len": 4, "output_len": 2,
                          "deadline_s": -1}, "deadline_s"),
                        ({"id": "x", "arrival_s": 0, "prompt_len": 4, "output_len": 2,
                          "prefix_blocks": [1, "2"], "block_tokens": 16}, "prefix_blocks"),
                        ({"id": "x", "arrival_s": 0, "prompt_len": 4, "output_len": 2,
                          "prefix_blocks": [1]}, "block_tokens")]:
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(line) + "\n")
        with pytest.raises(ValueError, match=f"bad.jsonl:1: .*{field}"):
            load_jsonl(path)
