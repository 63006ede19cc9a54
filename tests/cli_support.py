"""Running the CLI in a child process: a refusal's one error line, and whether torch loaded."""

from __future__ import annotations

import subprocess
import sys

#: Runs the CLI, then prints on stdout whether torch was imported, even when argparse exits.
PROBE = """
import sys
from aioserve.cli import main
try:
    status = main(sys.argv[1:])
finally:
    print("torch imported:", "torch" in sys.modules)
sys.exit(status)
"""


def refuse(*args: str) -> str:
    """The one error line of a refused invocation that never imported torch."""
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "torch imported: False"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aioserve: error: "), lines
    return lines[0]
