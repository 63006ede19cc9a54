"""``aioserve env``: what this installation runs on, for a bug report."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from aioserve.runners.cpu.cpu_info import CPU_FEATURES, cpu_features, cpu_model

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers

#: Environment variables that change which kernels run (and so the logits' bits).
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
                    "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS",
                    "AIOSERVE_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    return subparsers.add_parser(
        "env", help="print versions, platform, CPU features, threads and CUDA (for bug reports)")


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def report() -> list[tuple[str, str]]:
    """(label, value) lines describing this installation (imports torch)."""
    import torch

    import aioserve

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    cuda = "no"
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
        cuda = f"yes, CUDA {torch.version.cuda}, {count} device(s): {', '.join(names)}"
    kernels = [f"{name}={os.environ[name]}" for name in KERNEL_VARIABLES if name in os.environ]
    yes_no = {True: "yes", False: "no"}
    return [
        ("aioserve", f"{package_version('aioserve')} ({os.path.dirname(aioserve.__file__)})"),
        ("Python", f"{platform.python_version()} ({platform.python_implementation()}, "
                   f"{sys.executable})"),
        ("platform", platform.platform()),
        ("torch", f"{torch.__version__} (CUDA build: {torch.version.cuda or 'none'})"),
        *((name, package_version(name))
          for name in ("transformers", "tokenizers", "numpy", "aiohttp", "pydantic")),
        ("CPU", f"{cpu_model()} ({platform.machine()})"),
        ("CPU features", " ".join(cpu_features()) or "none of " + " ".join(CPU_FEATURES)),
        ("ATen CPU capability", torch.backends.cpu.get_cpu_capability()),
        ("MKL / oneDNN", f"{yes_no[torch.backends.mkl.is_available()]} / "
                         f"{yes_no[torch.backends.mkldnn.is_available()]}"),
        ("CPUs", f"{os.cpu_count()} logical, {usable} usable by this process"),
        ("torch threads", str(torch.get_num_threads())),
        ("CUDA available", cuda),
        ("kernel settings", " ".join(kernels) or "none set"),
    ]


def run(args: argparse.Namespace) -> int:
    lines = report()
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label + ':':<{width + 1}} {value}")
    return 0
