"""docs/lab.md's worked example, from a trace to a replica count, run as written (issue 49):
calibrate on the trace's held-out window, one replica's capacity, the fewest replicas.
Only paths change (the shared traces and model by absolute path; the profile in a
temporary folder)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = (REPO / "docs" / "lab.md").read_text()
SECTION = LAB.split("\n## Worked example: from a trace to a replica count\n", 1)[1]
[EXAMPLE] = re.findall(r"```bash\n(.*?)```", SECTION.split("\n## ", 1)[0], re.S)


def as_run_here(script: str) -> str:
    """The example with the shared traces and model by absolute path."""
    return script.replace("../shared/", f"{REPO.parent / 'shared'}/")


def test_the_worked_example_ends_in_a_replica_count(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", as_run_here(EXAMPLE)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "azure.json").is_file()
    out = result.stdout
    assert "capacity @ 90% (req/s)" in out, out[-3000:]
    rows = [line.split() for line in out.splitlines() if line.startswith("fcfs ")]
    routers = {row[1] for row in rows if len(row) > 2 and row[1] in ("round_robin", "prefix")}
    assert routers == {"round_robin", "prefix"}, out[-3000:]
    assert "replicas (SLO >= 90%)" in out, out[-3000:]
    # each router answers: the fewest replicas (1..16), or "> 16" where a busy machine's
    # profile falls short even at 16
    counts = [row[2] for row in rows if len(row) > 2 and row[1] in ("round_robin", "prefix")]
    assert all((count.isdigit() and 1 <= int(count) <= 16) or count == ">"
               for count in counts), out[-3000:]
