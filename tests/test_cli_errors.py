"""The command line (issue 9): one ``aioserve: error:`` line and status 2 for a device
this torch lacks and a context longer than the model's; ``--version``; every option's
help has a description and its default."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

from aioserve import __version__
from aioserve.cli import build_parser, main


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aioserve.cli", *args], capture_output=True,
                          text=True, timeout=300)


def error_lines(stderr: str) -> list[str]:
    """stderr without the weight-loading progress bar."""
    return [line for line in stderr.splitlines() if line and "Loading weights" not in line]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
@pytest.mark.parametrize("command", ["generate", "serve"])
def test_cuda_device_without_cuda_is_one_error_line(model_dir, command):
    args = ["hi"] if command == "generate" else ["--port", "0"]
    result = run_cli(command, *args, "--model", model_dir, "--device", "cuda")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith(  # a CPU build is told by its version
        ("aioserve: error: --device cuda: ", "aioserve: error: device 'cuda'")), lines


def test_max_model_len_beyond_the_model_is_refused(model_dir):
    result = run_cli("generate", "hi", "--model", model_dir, "--max-model-len", "4096")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert lines == ["aioserve: error: --max-model-len 4096: beyond the model's context of 512 "
                     "tokens (max_position_embeddings in its config.json)"]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"aioserve {__version__}"


def _parsers(parser: argparse.ArgumentParser, name: str = "aioserve"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_option_has_a_description_and_its_default():
    missing = []
    for name, parser in _parsers(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                                   argparse._SubParsersAction)):
                continue
            text = formatter._expand_help(action) if action.help else ""
            label = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not text.strip():
                missing.append(f"{label}: no description")
            elif action.option_strings and action.default not in (None, False, []) and (
                    "default" not in text.lower()):
                missing.append(f"{label}: default {action.default!r} not shown")
    assert not missing, "\n".join(missing)


def test_bad_or_busy_port_is_one_error_line(model_dir):
    result = run_cli("serve", "--model", model_dir, "--port", "99999")
    assert result.returncode == 2
    assert error_lines(result.stderr) == ["aioserve: error: --port must be in [0, 65535], "
                                          "got 99999"]
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("serve", "--model", model_dir, "--port", str(port))
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"aioserve: error: --host/--port: cannot listen on 127.0.0.1:{port}")
    # said before the model loads (no weights bar) and before the start-up summary
    assert result.stderr.strip().splitlines() == [last], result.stderr


def test_plot_without_matplotlib_names_the_extra(monkeypatch, capsys, tmp_path):
    """matplotlib is the `plots` extra, not a core dependency: without it `--plot` is one
    error line naming the extra, and the simulation itself still runs."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    status = main(["simulate", "--workload", "article-example", "--scheduler", "fcfs",
                   "--plot", str(tmp_path / "plot.png")])
    assert status == 2
    assert "aioserve: error: --plot needs matplotlib: pip install 'aioserve[plots]'" in (
        capsys.readouterr().err)
    assert not (tmp_path / "plot.png").exists()


EMPTY_KEY = ("aioserve: error: --api-key (or $AIOSERVE_API_KEY) is empty: an unset variable? "
             "The server would be open to anyone; give a key, or leave both out to serve "
             "without one")


def test_an_empty_api_key_is_refused_not_served_open(model_dir, monkeypatch, capsys):
    """``--api-key "$KEY"`` with KEY unset is ``--api-key ""``: refused (status 2), as
    is an empty or blank ``AIOSERVE_API_KEY``, before anything loads."""
    result = run_cli("serve", "--model", model_dir, "--port", "0", "--api-key", "")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [EMPTY_KEY]
    for value in ("", "  "):
        monkeypatch.setenv("AIOSERVE_API_KEY", value)
        assert main(["serve", "--model", model_dir, "--port", "0"]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [EMPTY_KEY]
    monkeypatch.setenv("AIOSERVE_API_KEY", "")
    assert main(["serve", "--model", model_dir, "--api-key", " ", "--ray"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [EMPTY_KEY]
