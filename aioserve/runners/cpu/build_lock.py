"""The kernel build folder's lock: one build at a time, none outliving its builder."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["HEARTBEAT_S", "STALE_LOCK_S", "heartbeat", "lock_owner_alive", "take_lock",
           "wait_for_build_lock"]

logger = logging.getLogger("aioserve.runners.cpu.native_kernels")

#: Seconds between a builder's touches of its lock.
HEARTBEAT_S = 10.0
#: A lock not touched for this many seconds is a killed build's.
STALE_LOCK_S = 120.0


def _lock_owner(lock: Path) -> tuple[int, str] | None:
    """(PID, host) written in ``lock``; None when missing, unreadable or not yet written."""
    try:
        text = lock.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(text) != 2 or not text[0].isdigit():
        return None
    return int(text[0]), text[1]


def lock_owner_alive(lock: Path) -> bool:
    """Whether ``lock`` exists and its owner may still build."""
    owner = _lock_owner(lock)
    if owner is None:
        return lock.exists()
    if owner[1] != socket.gethostname():
        return True
    try:
        os.kill(owner[0], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def wait_for_build_lock(lock: Path) -> None:
    """Wait while another process builds; remove a killed build's lock."""
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > STALE_LOCK_S:
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            logger.warning("removed a stale build lock %s (%.0f s old)", lock, age)
            return
        time.sleep(0.5)


def take_lock(lock: Path, finished: Callable[[], bool]) -> bool:
    """Hold ``lock`` (True), or find the build ``finished`` meanwhile (False)."""
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if finished():
                return False
            owner = _lock_owner(lock)
            if owner is None and _age(lock) < 5:  # its owner is writing it
                time.sleep(0.1)
            elif owner is None or owner[1] != socket.gethostname():
                wait_for_build_lock(lock)  # unreadable or another host's: by its age
            elif not lock_owner_alive(lock):
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                logger.warning("removed the build lock of a killed build %s", lock)
            elif _age(lock) > STALE_LOCK_S:  # alive, but no heartbeat: a reused PID
                wait_for_build_lock(lock)
            else:
                time.sleep(0.5)
            continue
        with os.fdopen(fd, "w", encoding="ascii") as file:
            file.write(f"{os.getpid()} {socket.gethostname()}\n")
        return True


def heartbeat(lock: Path, done: threading.Event) -> None:
    while not done.wait(HEARTBEAT_S):
        with contextlib.suppress(OSError):
            os.utime(lock)
