"""Issue 34, item 6: ``aioserve policies`` lists the installed policies, a third party's
entry point included, with each parameter's type, default and description, without
importing torch. A real subprocess; the third party is a real distribution on its path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from aioserve.scheduling.parameters import configuration_text, policy_configuration
from aioserve.scheduling.registry import load_scheduler
from schedulers.memory_aware import MemoryAwareScheduler
from schedulers.vtc import VTCScheduler

ROOT = Path(__file__).resolve().parents[1]

THIRD_PARTY = '''
from aioserve.scheduling import OrderedScheduler


class Newest(OrderedScheduler):
    """Serve the newest request first.

    Args:
        depth: how many requests to look at
            (continued on a second line).
        watermark: as ``fcfs``.
    """

    def __init__(self, depth: int = 3, watermark: float = 0.01) -> None:
        super().__init__(watermark)
        self.depth = depth
'''


def test_policies_lists_built_in_and_third_party_policies_without_torch(tmp_path):
    (tmp_path / "newest_policy.py").write_text(THIRD_PARTY)
    dist = tmp_path / "newest_policy-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: newest-policy\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[aioserve.schedulers]\nnewest = newest_policy:Newest\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "aioserve.cli", "policies"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "torch" not in imported and "transformers" not in imported
    assert "pydantic" in imported  # the importtime listing is read right
    assert "newest  (newest_policy:Newest): Serve the newest request first." in out
    assert ("  depth: int = 3  how many requests to look at (continued on a second line)."
            in out.splitlines())
    assert "vtc  (schedulers.vtc:VTCScheduler)" in out
    assert ("  preempt: bool = true  preempt for the least-served waiting tenant (default True)."
            in out)
    assert "static  (schedulers.static:StaticScheduler)" in out and "(no parameters)" in out


def test_policies_names_an_unknown_policy():
    done = subprocess.run([sys.executable, "-m", "aioserve.cli", "policies", "nope"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert "unknown policy 'nope'; registered: " in done.stderr and "fcfs" in done.stderr


def test_the_configuration_fills_in_defaults_and_keeps_what_a_policy_was_made_with():
    assert configuration_text(policy_configuration(
        load_scheduler("vtc", {"preempt": False}), {"preempt": False})) == (
        '{"prompt_weight": 1.0, "output_weight": 2.0, "weights": null, "preempt": false, '
        '"watermark": 0.01}')
    made = VTCScheduler(output_weight=3.0, preempt=False)  # in code, no --scheduler-config
    assert policy_configuration(made, None) == {
        "prompt_weight": 1.0, "output_weight": 3.0, "weights": None, "preempt": False,
        "watermark": 0.01}
    # the predictor object it made from None is not a value to print: the default stands
    assert policy_configuration(MemoryAwareScheduler(watermark=0.9), None) == {
        "predictor": None, "watermark": 0.9, "predictor_config": None}
