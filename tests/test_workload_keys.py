"""Workload files refuse unknown keys by name and line (issue 34), and tell production
traces apart by their columns before calling anything an unknown key."""

from __future__ import annotations

import json

import pytest

from aioserve.request_meta import RequestMeta
from aioserve.workloads.request import WorkloadRequest, load_jsonl
from aioserve.workloads.trace_formats import TRACE_FORMATS, first_line_format

REQUEST = {"id": "a", "arrival_s": 0, "prompt_len": 4, "output_len": 3}


def test_unknown_key_is_refused_with_file_line_and_the_known_keys(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps(REQUEST) + "\n" + json.dumps(REQUEST | {"id": "b", "x": 1}))
    with pytest.raises(ValueError) as caught:
        load_jsonl(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:2: unknown key 'x' (known: id, arrival_s, ")
    assert "did you mean" not in message  # nothing is close to 'x'


def test_known_keys_and_nulls_still_load(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps(REQUEST | {"tenant": "t", "length_hint": None}))
    assert load_jsonl(path) == [WorkloadRequest("a", 0, 4, 3, meta=RequestMeta(tenant="t"))]


def test_a_trace_row_in_the_middle_of_a_workload_is_named_at_its_line(tmp_path):
    path = tmp_path / "w.jsonl"
    row = {"arrived_at": 0.5, "num_prefill_tokens": 3, "num_decode_tokens": 2}
    path.write_text(json.dumps(REQUEST) + "\n" + json.dumps(row))
    with pytest.raises(ValueError, match=r"w\.jsonl:2: this looks like an Azure LLM "
                                         r"inference trace as processed by Splitwise"):
        load_jsonl(path)


@pytest.mark.parametrize("found", TRACE_FORMATS, ids=lambda f: f.name.split(" (")[0])
def test_each_format_is_told_by_its_columns_as_json_or_csv(found):
    columns = sorted(found.columns)
    assert first_line_format(",".join(columns)) == found
    assert first_line_format(json.dumps(dict.fromkeys(columns, 1) | {"extra": 1})) == found
    assert first_line_format(",".join(columns[1:])) is None
    assert first_line_format(json.dumps(REQUEST)) is None

