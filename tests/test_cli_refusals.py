"""Refusals of the command line come before torch loads (issue 34): each bad invocation,
run as a real process, exits with status 2 and one ``aioserve: error:`` line naming the
option, and the process never imported torch (so the answer is quick)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import refuse

BAD_ENGINE_OPTIONS = [
    (["--scheduler", "fcfss"], "--scheduler", "unknown scheduler 'fcfss'"),
    (["--scheduler-config", "{"], "--scheduler-config", "not valid JSON"),
    (["--scheduler-config", "[1]"], "--scheduler-config", "must be a JSON object"),
    (["--scheduler-config", '{"x": 1}'], "--scheduler-config", "no parameter 'x'"),
    (["--scheduler-config", '{"watermark": "high"}'], "--scheduler-config", "'watermark'"),
    (["--scheduler-config", '{"watermark": 5}'], "--scheduler-config", "watermark must be"),
    (["--max-num-seqs", "0"], "--max-num-seqs", "positive integer"),
    (["--block-size", "x"], "--block-size", "positive integer"),
    (["--kv-cache-memory", "lots"], "--kv-cache-memory", "not a memory size"),
    (["--dtype", "float8"], "--dtype", "invalid choice"),
    (["--device", "tpu"], "--device", "must be auto, cpu or cuda[:N]"),
]


@pytest.mark.parametrize(("options", "flag", "reason"), BAD_ENGINE_OPTIONS,
                         ids=[" ".join(case[0]) for case in BAD_ENGINE_OPTIONS])
def test_bad_engine_options_are_refused_before_torch(model_dir, options, flag, reason):
    line = refuse("serve", "--model", model_dir, "--port", "0", *options)
    assert flag in line and reason in line, line


@pytest.mark.parametrize(("options", "flag"), [
    (["--stats-log-interval", "-1"], "--stats-log-interval"),
    (["--ws-max-pending", "0"], "--ws-max-pending"),
    (["--max-body-bytes", "5"], "--max-body-bytes"),
    (["--port", "99999"], "--port"),
    (["--chat-template", "/no/such/template.jinja"], "--chat-template"),
    (["--step-log", "/no/such/dir/steps.jsonl"], "--step-log"),
    (["--step-log", "steps.jsonl", "--ray"], "--step-log"),
])
def test_bad_server_options_are_refused_before_torch(model_dir, options, flag):
    assert flag in refuse("serve", "--model", model_dir, *options)


@pytest.mark.parametrize(("options", "flag"), [
    (["--max-tokens", "0"], "--max-tokens"),
    (["--top-p", "2"], "--top-p"),
    (["--scheduler", "fcfss"], "--scheduler"),
])
def test_bad_sampling_options_are_refused_before_torch(model_dir, options, flag):
    assert refuse("generate", "hi", "--model", model_dir, *options).startswith(
        f"aioserve: error: {flag}")


def test_bench_and_simulate_refuse_before_torch(model_dir, tmp_path):
    line = refuse("bench", "throughput", "--model", model_dir, "--scheduler", "fcfss")
    assert "--scheduler" in line and "'fcfss'" in line
    line = refuse("bench", "throughput", "--model", str(tmp_path / "nope"))
    assert line.startswith("aioserve: error: --model: ")
    assert "--num-prompts" in refuse("bench", "throughput", "--model", model_dir,
                                     "--num-prompts", "0")
    assert "--model" in refuse("simulate", "--real", "--model", str(tmp_path / "nope"))
    line = refuse("simulate", "--real", "--model", model_dir, "--scheduler", "fcfs,fcfss")
    assert "--scheduler" in line and "'fcfss'" in line
    assert "--scheduler-config" in refuse("simulate", "--scheduler-config", "{")


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_a_model_directory_without_config_json_is_named(tmp_path, command):
    """The directory and the missing file are named (transformers says "Should have a
    `model_type` key in its config.json")."""
    (tmp_path / "tokenizer.json").write_text(json.dumps({}))
    head = ["hi"] if command == "generate" else []
    line = refuse(command, *head, "--model", str(tmp_path))
    assert line == (f"aioserve: error: --model: model directory {str(tmp_path)!r} has no "
                    "config.json (a transformers model directory holds one)")


@pytest.mark.parametrize("spec", ["/no/such/model", "./no-such-model", "../no/such-model"])
def test_a_missing_model_directory_is_named(spec):
    line = refuse("serve", "--model", spec)
    assert line == f"aioserve: error: --model: model directory {spec!r} does not exist"


def test_a_model_file_is_not_a_directory(model_dir):
    config = str(Path(model_dir) / "config.json")
    assert refuse("serve", "--model", config) == (
        f"aioserve: error: --model: {config!r} is a file, not a model directory")


REQUEST = {"id": "a", "arrival_s": 0, "prompt_len": 4, "output_len": 3}


@pytest.mark.parametrize("command", [["simulate"], ["bench", "serve", "--base-url",
                                                    "http://127.0.0.1:9"]])
def test_an_unknown_workload_key_is_named_with_its_line(tmp_path, command):
    """``"tennant"`` was ignored: the request ran without a tenant."""
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps(REQUEST) + "\n\n" + json.dumps(REQUEST | {
        "id": "b", "tennant": "x"}) + "\n")
    line = refuse(*command, "--workload", str(path))
    assert line.startswith(f"aioserve: error: --workload: {path}:3: unknown key 'tennant'; "
                           "did you mean "
                           "'tenant'? (known: id, arrival_s, prompt_len, output_len, "), line


def test_a_missing_trace_file_is_named_as_one(tmp_path):
    """A misspelled trace path said only "not ... or a file"."""
    path = tmp_path / "azure-convo.csv"
    line = refuse("simulate", "--workload", f"{path}:n=5")
    assert line.startswith(f"aioserve: error: --workload: workload '{path}:n=5': no file "
                           f"'{path}', and not a named workload (article-example, "), line


def test_a_production_trace_is_read_and_a_bad_row_named_by_file_line_and_column(tmp_path):
    """A file whose columns mark a known trace format is read as that format (issue 32);
    a bad row is refused naming the file, the line and the column, before torch loads."""
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5,
                                    "hash_ids": [0]}) + "\n")
    ran = subprocess.run([sys.executable, "-m", "aioserve.cli", "simulate", "--workload",
                          str(mooncake), "--json"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.splitlines()[-1])["finished"] == 1
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,x\n")
    assert refuse("simulate", "--workload", str(azure)) == (
        f"aioserve: error: --workload: {azure}:2: column 'GeneratedTokens': expected a whole "
        "number of tokens >= 0, got 'x'")


@pytest.mark.parametrize(("text", "reason"), [
    (None, "cannot read it: No such file or directory"),
    ('{"a": 1}', "not a step-cost profile: unknown key 'a' (known: intercept_ms, "),
    ("{", "not a step-cost profile: not JSON ("),
    ("[1]", "not a step-cost profile: not a JSON object"),
    ('{"per_seq_ms": 1}', "not a step-cost profile: intercept_ms is required"),
    ('{"intercept_ms": "2"}', "not a step-cost profile: intercept_ms must be a finite number"),
])
def test_a_missing_or_malformed_profile_names_the_option_and_the_path(tmp_path, text, reason):
    """Not ``StepCostModel.__init__() got an unexpected keyword argument 'a'``."""
    path = tmp_path / "profile.json"
    if text is not None:
        path.write_text(text)
    line = refuse("simulate", "--profile", str(path))
    assert line.startswith(f"aioserve: error: --profile {path}: {reason}"), line


def test_a_saved_profile_loads_back_as_it_was(tmp_path):
    from aioserve.sim.step_cost import StepCostModel

    model = StepCostModel(1.5, 0.25, 0.01, 0.001, source={"model": "m"}, fit={"r2": 0.9})
    assert StepCostModel.load(model.save(tmp_path / "profile.json")) == model


# --- calibrate --random-model (issue 32 item 4), calibrate --from-steps ---

@pytest.mark.parametrize(("options", "start"), [
    (["--random-model", "smollm2-135m", "--model", "m"],
     "--random-model: give --model or --random-model, not both"),
    (["--random-model", "no-such-shape"],
     "--random-model 'no-such-shape': no such config file and no shipped shape"),
    (["--real", "--random-model", "smollm2-135m"],
     "--real: not an option of aioserve calibrate; aioserve simulate takes it"),
    (["--profile", "p.json", "--random-model", "smollm2-135m"],
     "--profile: not an option of aioserve calibrate; aioserve simulate or aioserve capacity"),
    ([], "--model: give the model to run"),
    (["--random-model", "smollm2-135m", "--device", "tpu"],
     "--device: device must be auto, cpu or cuda[:N]"),
    (["--from-steps", "/no/such/steps.jsonl"],
     "--from-steps: no file '/no/such/steps.jsonl'"),
    (["--from-steps", "/no/such/steps.jsonl", "--model", "m"],
     "--from-steps: the step log names its model"),
    (["--from-steps", "/", "--profile-out", "p.json"],
     "--from-steps: a directory, not a file: '/'"),
    (["--from-steps", "/no/such/steps.jsonl", "--slots", "4"],
     "--slots: not with --from-steps"),
    (["--from-steps", "/no/such/steps.jsonl", "--forward", "transformers"],
     "--forward: not with --from-steps"),
])
def test_bad_calibration_flags_are_refused_before_any_model_loads(options, start):
    line = refuse("calibrate", *options)
    assert line.startswith(f"aioserve: error: {start}"), line


@pytest.mark.parametrize(("command", "options", "start"), [
    ("simulate", ["--random-model", "smollm2-135m"], "--model: only with --real"),
    ("simulate", ["--from-steps", "steps.jsonl"],
     "--from-steps: not an option of aioserve simulate; aioserve calibrate takes it"),
    ("simulate", ["--sweep-repeats", "2"],
     "--sweep-repeats: not an option of aioserve simulate; aioserve capacity takes it"),
    ("capacity", ["--html", "x.html", "--sweep-rate", "1:2"],
     "--html: not an option of aioserve capacity; aioserve simulate takes it"),
    ("capacity", ["--compare", "--sweep-rate", "1:2"],
     "--compare: not an option of aioserve capacity; aioserve simulate takes it"),
    ("capacity", ["--workload", "poisson"], "--sweep-rate: give --sweep-rate LO:HI[:N]"),
    ("calibrate", ["--sweep-rate", "1:2"],
     "--sweep-rate: not an option of aioserve calibrate; aioserve capacity takes it"),
])
def test_an_option_of_another_command_is_refused_naming_it(command, options, start):
    """Issue 48 item 4: each of the lab's three commands refuses what it does not take."""
    line = refuse(command, *options)
    assert line.startswith(f"aioserve: error: {start}"), line


@pytest.mark.parametrize(("options", "new"), [
    (["--calibrate", "--from-steps", "/no/such/steps.jsonl"], "aioserve calibrate"),
    (["--sweep-rate", "3:1"], "aioserve capacity --sweep-rate"),
    (["--fewest-replicas", "2", "--replicas", "2"], "aioserve capacity --fewest-replicas"),
])
def test_the_old_simulate_spellings_name_the_new_command(options, new):
    """The old spelling runs the new command after a one-line notice (here to its refusal)."""
    result = subprocess.run([sys.executable, "-m", "aioserve.cli", "simulate", *options],
                            capture_output=True, text=True, timeout=120)
    notice, *rest = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(rest) == 1, result.stderr
    assert notice.startswith("aioserve: aioserve simulate --") and f"is now {new}" in notice


def test_each_lab_command_lists_at_most_twenty_options():
    for command in ("simulate", "calibrate", "capacity"):
        result = subprocess.run([sys.executable, "-m", "aioserve.cli", command, "--help"],
                                capture_output=True, text=True, timeout=120)
        listed = [line for line in result.stdout.splitlines() if line.startswith("  --")]
        assert 10 <= len(listed) <= 20, (command, len(listed))


@pytest.mark.parametrize(("text", "reason"), [
    ("", "no requests (the file is empty)"),
    ("\n\n", "no requests (the file is empty)"),
    ("arrived_at,num_prefill,num_decode_tokens\n1,2,3\n",
     ":1: CSV header with columns arrived_at, num_prefill, num_decode_tokens: no trace format "
     "has these (known: "),
    ('{\n  "id": "a"\n}\n', ":1: not JSON: a workload file holds one JSON object per line"),
])
@pytest.mark.parametrize("command", [["simulate"], ["bench", "serve", "--base-url",
                                                    "http://127.0.0.1:9"]])
def test_an_empty_or_unreadable_workload_file_is_named(tmp_path, command, text, reason):
    """An empty file raised IndexError (simulate) or ran 0 requests to nan figures (bench
    serve); a misspelt trace header or a pretty-printed JSON file said only "not JSON"."""
    path = tmp_path / "w.csv"
    path.write_text(text)
    line = refuse(*command, "--workload", str(path))
    assert line.startswith(f"aioserve: error: --workload: {path}"), line
    assert reason in line, line


def test_a_directory_is_no_workload(tmp_path):
    line = refuse("simulate", "--workload", f"{tmp_path}:n=5")
    assert line.endswith(f"{str(tmp_path)!r} is a directory; give a trace or workload file "
                         "in it"), line


@pytest.mark.parametrize(("options", "flag", "reason"), [
    (["--request-rate", "0"], "--request-rate", "must be a number > 0, got 0"),
    (["--request-rate=-5"], "--request-rate", "must be a number > 0, got -5"),
    (["--slo-ttft-ms=-5"], "--slo-ttft-ms", "must be a number >= 0"),
    (["--burstiness", "0"], "--burstiness", "must be a number > 0"),
    (["--plot", "/no/such/dir/p.png"], "--plot", "no directory '/no/such/dir'"),
])
def test_bad_bench_serve_options_are_refused_before_any_request(options, flag, reason):
    """``--request-rate 0`` raised ZeroDivisionError; a negative rate or objective ran."""
    line = refuse("bench", "serve", "--base-url", "http://127.0.0.1:9", *options)
    assert flag in line and reason in line, line


@pytest.mark.parametrize(("options", "flag", "reason"), [
    (["--plot", "/no/such/dir/p.png"], "--plot", "no directory '/no/such/dir'"),
    (["--compare", "--report", "/no/such/dir/r.html"], "--report", "no directory"),
    (["--html", "."], "--html", "'.' is a directory"),
    (["--report", "r.html"], "--report", "only with --compare"),
    (["--scheduler", "fcfs,spf,fcfs"], "--scheduler", "'fcfs' given twice"),
    (["--scheduler", "edf,mlfq", "--scheduler-config", '{"shed_late": true}'],
     "--scheduler-config", "'mlfq' has no parameter 'shed_late', and one object applies to "
     'every policy of this run (edf, mlfq); key it by policy: {"edf": {"shed_late": true}}'),
    (["--scheduler", "edf", "--scheduler-config", '{"shed_late": "yes"}'], "'shed_late'",
     "valid boolean"),
    (["--scheduler", "mlfq", "--scheduler-config", '{"levels": "3"}'], "'levels'",
     "valid integer"),
    (["--scheduler", "spf", "--scheduler-config", '{"predictor": "lerned"}'],
     "predictor 'lerned'", "not one of hint, cap, oracle, learned"),
])
def test_bad_simulate_options_are_refused_before_the_run(options, flag, reason):
    """Each was accepted: outputs were checked only after the simulation (and said "cannot
    load"), strings were coerced to booleans and integers, a policy ran twice."""
    line = refuse("simulate", "--workload", "poisson:n=50", *options)
    assert flag in line and reason in line, line


def test_cuda_on_a_cpu_build_of_torch_is_refused_before_torch_loads(model_dir):
    """It was refused, but after torch loaded (about 5 s)."""
    import importlib.metadata

    if not importlib.metadata.version("torch").endswith("+cpu"):
        pytest.skip("torch is not a CPU build")
    for command in (["serve", "--model", model_dir], ["bench", "throughput", "--model", model_dir],
                    ["simulate", "--real", "--model", model_dir]):
        line = refuse(*command, "--device", "cuda")
        assert "--device cuda: this torch (" in line and "is a CPU build" in line, line


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_output_in_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    line = refuse("simulate", "--workload", "poisson:n=50", "--plot", str(folder / "p.png"))
    assert "--plot: cannot write" in line and "permission denied" in line, line
