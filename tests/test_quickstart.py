"""The README's quick start, run as written (issue 49): its fenced code blocks are read from
README.md, so the front door cannot drift from the code. Only the server's port changes
(a free one instead of 8000). The README's and docs' links to docs/ pages must exist."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
QUICK_START = README.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
#: (language, code) of each fenced block of the quick start, in order.
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", QUICK_START, re.S)
#: The command line's environment: this interpreter's ``python`` and ``aioserve`` first.
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
ENV.pop("AIOSERVE_API_KEY", None)  # the quick start's server runs without a key


def block(language: str, contains: str) -> str:
    """The one quick-start block of ``language`` whose code contains ``contains``."""
    [code] = [code for lang, code in BLOCKS if lang == language and contains in code]
    return code


def run(language: str, code: str, timeout: float = 300) -> str:
    """Run a block (bash, or python in a fresh interpreter) from the repo's root; its stdout."""
    command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [
        sys.executable, "-c", code]
    result = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_first_lines_give_the_install_and_test_commands():
    first = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first is not None and README.index(first.group(0)) < README.index("\n## ")
    lines = first.group(1).splitlines()
    cpu = next(i for i, line in enumerate(lines) if "download.pytorch.org/whl/cpu" in line)
    main = next(i for i, line in enumerate(lines) if "aioserve generate" in line)
    assert cpu < main  # the CPU wheel index before the command that would need it
    assert lines[-1] == "python3 -m pytest -q"
    assert len(README.splitlines()) <= 250
    assert README.count("load average") <= 2


def test_the_python_snippet_streams_a_continuation():
    text = run("python", block("python", "async for out in engine.generate"))
    assert len(text.strip()) > 20, text


def test_generate_streams_a_continuation():
    text = run("bash", block("bash", "aioserve generate"))
    assert len(text.strip()) > 20, text


@pytest.fixture(scope="module", autouse=True)
def server() -> Iterator[subprocess.Popen[str]]:
    """The quick start's ``aioserve serve`` on a free loopback port, started first so that
    its model loads while the other blocks run."""
    command = block("bash", "aioserve serve").replace("\\\n", " ").strip()
    process = subprocess.Popen(["bash", "-c", f"exec {command} --port 0"], cwd=REPO, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


@pytest.fixture(scope="module")
def served(server: subprocess.Popen[str]) -> str:
    """The server's base URL, once it listens."""
    assert server.stdout is not None
    line = server.stdout.readline()
    assert line.startswith("listening on http://127.0.0.1:"), (
        line, server.stderr.read() if server.poll() is not None else "")
    return line.split()[-1]


def test_the_openai_client_gets_a_completion(served):
    code = block("python", "from openai import OpenAI").replace("http://127.0.0.1:8000", served)
    assert served in code
    assert len(run("python", code).strip()) > 5


def test_the_websocket_client_gets_two_streams(served):
    ws_url = served.replace("http://", "ws://")
    code = block("bash", "websocket_client.py").replace("ws://127.0.0.1:8000", ws_url)
    assert ws_url in code
    out = run("bash", code)
    assert len(out.strip().splitlines()) == 2 and "error" not in out, out


def test_two_policies_are_compared_in_the_simulator():
    out = run("bash", block("bash", "aioserve simulate"))
    rows = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"fcfs", "vtc"} <= rows, out


def test_your_own_policy_is_the_examples_and_runs():
    code = block("python", "class FairShareScheduler")
    example = (REPO / "examples" / "custom_scheduler.py").read_text()
    assert code.split("\n\n\nclass ", 1)[1].split('    """', 1)[0] in example  # same class
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["FairShareScheduler"].name == "fair_share"
    out = run("bash", block("bash", "examples/custom_scheduler.py"))
    assert "fair_share" in out and "fcfs" in out, out


@pytest.mark.parametrize("page", [REPO / "README.md"], ids=["README.md"])
def test_the_readmes_links_to_docs_exist(page):
    for target in re.findall(r"\]\(((?:docs/)[^)#\s]+)", page.read_text()):
        assert (REPO / target).is_file(), target
