"""Busy co-tenant processes, and child processes that die with their parent."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import subprocess
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["CoTenants", "die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` killing the child when its parent dies (Linux); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    libc = ctypes.CDLL(path, use_errno=True)

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return preexec


class CoTenants:
    """``count`` busy processes while inside ``with``, ended on leaving it or being killed."""

    def __init__(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"co-tenant count must be >= 0, got {count}")
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        while len(self.procs) < self.count:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent()))

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs = []

    def __enter__(self) -> CoTenants:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> Any:
        self.stop()
        return None
