"""``aioserve --version`` (from the package metadata, without the commands' imports) and
``aioserve env``, the environment report for bug reports (issue 34, item 1): real
subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version

import torch

ENV_LABELS = ["aioserve", "Python", "platform", "torch", "transformers", "tokenizers", "numpy",
              "aiohttp", "pydantic", "CPU", "CPU features", "ATen CPU capability",
              "MKL / oneDNN", "CPUs", "torch threads", "CUDA available", "kernel settings"]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_version_is_the_installed_metadata_and_loads_no_command():
    result = subprocess.run([sys.executable, "-m", "aioserve.cli", "--version"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"aioserve {version('aioserve')}\n"
    loaded = run_python("import sys\nfrom aioserve.cli import main\nmain(['--version'])\n"
                        "print(sorted(m for m in ('torch', 'aiohttp', 'transformers', "
                        "'aioserve.commands.serve') if m in sys.modules))")
    assert loaded.stdout.splitlines() == [f"aioserve {version('aioserve')}", "[]"]


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            line = next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split())


def test_env_reports_versions_cpu_features_and_kernel_settings():
    settings = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "default"}
    result = subprocess.run([sys.executable, "-m", "aioserve.cli", "env"], capture_output=True,
                            text=True, timeout=300, env={**os.environ, **settings})
    assert result.returncode == 0, result.stderr
    report = {label: value.strip() for label, value in
              (line.split(":", 1) for line in result.stdout.splitlines())}
    assert list(report) == ENV_LABELS
    assert report["aioserve"].startswith(version("aioserve") + " (")
    assert report["torch"].startswith(torch.__version__ + " ")
    assert report["transformers"] == version("transformers")
    assert report["tokenizers"] == version("tokenizers")
    flags = cpu_flags()
    for feature in ("avx2", "avx512f", "amx_tile", "amx_bf16"):
        assert (feature in report["CPU features"].split()) == (feature in flags), feature
    assert report["ATen CPU capability"] == "DEFAULT"  # what the variable asks of torch
    assert report["kernel settings"] == "ATEN_CPU_CAPABILITY=default MKL_CBWR=AVX2"
    assert report["CUDA available"].startswith("yes" if torch.cuda.is_available() else "no")
    assert report["torch threads"].isdigit()
