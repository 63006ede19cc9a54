"""The CLI says why, before torch loads (issue 49, defects 1, 2, 4, 5, 6, 8 and 10): each
refusal is one ``aioserve: error:`` line naming the flag, from a process that never
imported torch (``commands/preflight.py``); a stopped server's process exits at once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from test_cli_refusals import refuse

from aioserve import AsyncEngine, EngineConfig
from aioserve.server import create_app


def test_a_broken_chat_template_is_refused_naming_the_flag(model_dir, tmp_path):
    """Defect 1: ``{{ broken`` was accepted, and every chat request then got a 400 blaming
    the client's messages."""
    template = tmp_path / "broken.jinja"
    template.write_text("{{ broken")
    line = refuse("serve", "--model", model_dir, "--port", "0", "--chat-template", str(template))
    assert "--chat-template" in line and "not a valid Jinja template: line 1" in line, line


def test_the_example_chat_template_passes_the_check(model_dir):
    from argparse import Namespace

    from aioserve.commands.preflight import check_chat_template

    check_chat_template(Namespace(chat_template="examples/chat_template.jinja"))


@pytest.mark.parametrize(("options", "flags"), [
    (["--num-replicas", "2", "--router", "prefix"], "--num-replicas, --router"),
    (["--router-config", '{"load_bound": 0.5}'], "--router-config"),
    (["--ray-address", "auto"], "--ray-address"),
])
def test_ray_options_without_ray_are_refused(model_dir, options, flags):
    """Defect 2: ``--num-replicas 2 --router prefix`` without ``--ray`` was silently ignored."""
    line = refuse("serve", "--model", model_dir, "--port", "0", *options)
    assert f"{flags}: only with --ray" in line, line


STATE = json.dumps({"predictor_config": {"state_path": "/no/such/folder/lengths.json"}})


@pytest.mark.parametrize("command", [
    ["serve", "--port", "0"], ["generate", "hi"],
    ["simulate", "--workload", "routes:n=10"],
])
def test_a_predictor_state_path_in_a_missing_folder_is_refused(model_dir, command):
    """Defect 4: the run ended with a traceback, exit 0, and what was learnt was lost."""
    model = [] if command[0] == "simulate" else ["--model", model_dir]
    line = refuse(*command, *model, "--scheduler", "spf", "--scheduler-config", STATE)
    assert "--scheduler-config: predictor_config.state_path" in line, line
    assert "no directory '/no/such/folder'" in line, line


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["generate", "hi"]])
def test_a_missing_tokenizer_path_names_the_tokenizer_flag(model_dir, command):
    """Defect 5: ``--tokenizer /nope`` failed after torch loaded and named the model."""
    line = refuse(*command, "--model", model_dir, "--tokenizer", "/nope")
    assert "--tokenizer: '/nope' does not exist" in line, line


@pytest.mark.parametrize(("args", "reason"), [
    (["serve", "--port", "0", "--max-model-len", "100000"],
     "--max-model-len 100000: beyond the model's context of 512 tokens"),
    (["generate", "hi", "--max-model-len", "100000"],
     "--max-model-len 100000: beyond the model's context of 512 tokens"),
    (["generate", ""], "PROMPT is empty"),
    (["generate", "hi", "--max-tokens", "100000"],
     "--max-tokens 100000: the prompt and the output must fit the context of 512 tokens"),
    (["generate", "hi", "--max-model-len", "64", "--max-tokens", "64"],
     "--max-tokens 64: the prompt and the output must fit the context of 64 tokens "
     "(--max-model-len)"),
])
def test_what_config_json_or_the_prompt_decides_is_refused_before_the_model(model_dir, args,
                                                                             reason):
    """Defect 6: these waited 7-29 s for the model to load."""
    line = refuse(*args, "--model", model_dir)
    assert reason in line, line


@pytest.mark.parametrize(("args", "reason"), [
    (["bench", "throughput", "--input-len", "x"], "argument --input-len: expected LO:HI"),
    (["bench", "serve", "--base-url", "notaurl"],
     "--base-url 'notaurl': not an http(s) URL with a host"),
    (["serve", "--port", "0", "--scheduler-config", "/path/spf.json"],
     "--scheduler-config: takes the JSON text itself, not a file path ('/path/spf.json')"),
])
def test_refusals_speak_the_users_words(model_dir, args, reason):
    """Defect 8: "invalid parse_range value", "cannot reach notaurl: notaurl/ws", and a
    path given to --scheduler-config called "not valid JSON"."""
    model = ["--model", model_dir] if args[0] != "bench" or args[1] == "throughput" else []
    line = refuse(*args, *model)
    assert reason in line, line
    assert "parse_range" not in line


async def test_a_bad_websocket_message_is_called_a_message(model_dir):
    """Defect 8: a bad websocket message was called "the request body"."""
    engine = AsyncEngine(EngineConfig(model=model_dir, max_num_seqs=2))
    async with (
        TestServer(create_app(engine), host="127.0.0.1") as server,
        aiohttp.ClientSession() as http, http.ws_connect(server.make_url("/ws")) as ws,
    ):
        for text in ("{", "[1]"):
            await ws.send_str(text)
            error = await ws.receive_json(timeout=30)
            assert error["type"] == "error" and error["code"] == "invalid_json", error
            assert error["message"].startswith("the websocket message "), error


def test_a_stopped_server_exits_at_once(model_dir):
    """Defect 10: after "stopped" the process took 1-6 s more (the interpreter unloading
    torch and transformers); now "stopped", then "exiting", then the exit, status 0."""
    server = subprocess.Popen(
        [sys.executable, "-m", "aioserve.cli", "serve", "--model", model_dir, "--port", "0",
         "--kv-cache-memory", "16MiB"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("listening on http://"), line
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, stderr
    tail = [line.split(": ", 1)[-1] for line in stderr.strip().splitlines()[-2:]]
    assert tail == ["stopped", "exiting (status 0)"], stderr[-2000:]
