"""benchmarks/ holds tools a user runs: at most ten scripts, grouped (serving, lab,
kernels), each listed in benchmarks/README.md and opening with a docstring; no test imports
one (a test may run one as a user does, in a child process)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
GROUPS = {"serving", "lab", "kernels"}


def scripts() -> list[Path]:
    return sorted(BENCHMARKS.rglob("*.py"))


def test_at_most_ten_scripts_each_in_a_group():
    found = scripts()
    assert 0 < len(found) <= 10, [str(p.relative_to(BENCHMARKS)) for p in found]
    for path in found:
        assert path.parent.parent == BENCHMARKS and path.parent.name in GROUPS, path


def test_each_script_opens_with_a_docstring_and_is_listed_in_the_readme():
    readme = (BENCHMARKS / "README.md").read_text()
    for path in scripts():
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        assert docstring and len(docstring.split()) >= 5, path
        assert f"`{path.parent.name}/{path.name}`" in readme, path


def test_no_test_imports_a_benchmark():
    loaders = {"spec_from_file_location", "run_path", "import_module", "__import__"}
    for path in sorted((REPO / "tests").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names]
        imported += [node.module or "" for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom)]
        assert not any(name.split(".")[0] == "benchmarks" for name in imported), path.name
        calls = {getattr(node.func, "attr", getattr(node.func, "id", "")) for node in
                 ast.walk(tree) if isinstance(node, ast.Call)}
        names_a_benchmark = any(
            isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (node.value == "benchmarks" or "benchmarks/" in node.value)
            for node in ast.walk(tree))
        assert not (calls & loaders and names_a_benchmark), path.name  # loaded by file


@pytest.mark.parametrize("script", [p.relative_to(BENCHMARKS).as_posix() for p in scripts()])
def test_each_script_imports_and_answers_help(script):
    """A script whose imports broke (an API it uses was renamed) fails here, not in a user's
    hands; run as a user runs it, in a child process."""
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout, result.stdout[:500]
