"""``aioserve serve`` in a child process for benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from aioserve.bench.cotenants import die_with_parent

__all__ = ["ServerProcess", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """One ``aioserve serve`` child (``tree`` first on ``PYTHONPATH``; ``env`` None: unset)."""

    def __init__(self, args: list[str], tree: Path | None = None,
                 env: dict[str, str | None] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        environ = dict(os.environ)
        if tree is not None:
            environ["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(tree), environ.get("PYTHONPATH")) if p)
        for name, value in (env or {}).items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        self.lines: list[str] = []
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aioserve.cli", "serve", *args, "--port", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=environ, cwd=str(tree) if tree is not None else None,
            preexec_fn=die_with_parent())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def wait_ready(self, timeout: float = 300.0, poll_s: float = 0.02) -> float:
        """Seconds until ``GET /health`` answers 200; RuntimeError (with the log) otherwise."""
        deadline = self.started + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited:\n" + "\n".join(self.lines[-30:]))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                    if response.status == 200:
                        return time.perf_counter() - self.started
            except OSError:
                pass
            time.sleep(poll_s)
        raise RuntimeError(f"not ready in {timeout} s:\n" + "\n".join(self.lines[-30:]))

    def log_lines(self, pattern: str) -> list[str]:
        return [line for line in list(self.lines) if pattern in line]

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s`` seconds (idempotent)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)


def source_tree(path: str | None) -> Path | None:
    """``path`` as a source tree holding ``aioserve/`` (None stays None); ValueError otherwise."""
    if path is None:
        return None
    tree = Path(path).resolve()
    if not (tree / "aioserve" / "__init__.py").exists():
        raise ValueError(f"{path}: no aioserve package in this folder")
    return tree
