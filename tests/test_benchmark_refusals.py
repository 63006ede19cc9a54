"""Benchmarks refuse bad options before any model loads: exit status 2 and an error line
naming the option."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.mark.parametrize(("script", "options", "flag"), [
    ("lab/sim_vs_real.py", ["--loads", "0.9,abc"], "--loads"),
    ("lab/sim_vs_real.py", ["--loads", "0,1.2"], "--loads"),
    ("lab/sim_vs_real.py", ["--loads", "nan"], "--loads"),
    ("serving/endurance.py", ["--loads", "0.9,0"], "--loads"),
    ("serving/endurance.py", ["--duration-s", "inf"], "--duration-s"),
    ("serving/endurance.py", ["--trace", "/nonexistent.csv"], "--trace"),
    ("serving/endurance.py", ["--max-waiting", "0"], "--max-waiting"),
])
def test_a_bad_option_is_named_before_the_model_loads(script, options, flag):
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--model",
                             "/nonexistent", *options], capture_output=True, text=True,
                            timeout=120, cwd=BENCHMARKS.parent)
    assert result.returncode == 2, result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert "error:" in error and flag in error, error
