"""Building the compiled CPU kernels: one build folder per environment, never on the serving
path.

The folder is named by a hash of all the build depends on (sources, torch, interpreter, compiler,
CPU flags), since torch's loader rebuilds whenever its ``build.ninja`` changes. A process with no
finished build starts one in a niced child of its own session and serves with the stock kernels;
the child writes ``READY`` or ``FAILED``."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from aioserve.runners.cpu.build_lock import heartbeat, lock_owner_alive, take_lock
from aioserve.runners.cpu.cpu_info import cpu_flags_line

logger = logging.getLogger("aioserve.runners.cpu.native_kernels")

CSRC = Path(__file__).with_name("csrc")
#: The kernels' sources (one extension) and their headers of vector arithmetic.
SOURCES = [CSRC / name for name in ("amx_linear.cpp", "decode_attention.cpp",
                                    "greedy_tokens.cpp", "panel_linear.cpp", "rms_norm.cpp",
                                    "rope_and_cache.cpp", "silu_and_mul.cpp")]
HEADERS = [CSRC / "vec16.h"]
CFLAGS = ["-O3", "-march=native", "-fopenmp"]


def _compiler() -> str:
    name = os.environ.get("CXX", "c++")
    path = shutil.which(name)
    if path is None:
        return f"{name}: not found"
    stat = os.stat(path)
    return f"{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}"


def environment_key(sources: list[Path] | None = None) -> str:
    """16 hex digits naming what a build depends on."""
    import torch

    digest = hashlib.sha256()
    for path in [*(sources if sources is not None else SOURCES), *HEADERS]:
        digest.update(path.name.encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update(path.read_bytes())
    for part in (torch.__version__, os.path.realpath(os.path.dirname(torch.__file__)),
                 os.path.realpath(sys.prefix), sys.version, platform.machine(), cpu_flags_line(),
                 _compiler(), " ".join(CFLAGS)):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def _root() -> Path:
    """``$TORCH_EXTENSIONS_DIR``, else torch's default root, without importing torch's loader."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is not None:
        return Path(root)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return Path(cache) / "torch_extensions" / f"{python}_cpu"


class BuildFolder:
    """The build folder of this environment and the files that say its state."""

    def __init__(self, sources: list[Path] | None = None, root: Path | None = None) -> None:
        self.sources = list(sources if sources is not None else SOURCES)
        self.name = f"aioserve_cpu_{environment_key(self.sources)}"
        self.path = (root if root is not None else _root()) / self.name
        self.library = self.path / f"{self.name}.so"
        self.ready = self.path / "READY"
        self.failed = self.path / "FAILED"
        self.lock = self.path / "aioserve.lock"
        self.log = self.path / "build.log"

    def state(self) -> str:
        """``"ready"``, ``"failed"``, ``"building"`` or ``"absent"``."""
        if self.ready.exists() and self.library.exists():
            return "ready"
        if self.failed.exists():
            return "failed"
        return "building" if lock_owner_alive(self.lock) else "absent"

    def failure(self) -> str:
        with contextlib.suppress(OSError):
            return self.failed.read_text(encoding="utf-8").splitlines()[0]
        return "unknown"


def _ninja_on_path() -> None:
    """Put the ``ninja`` package's binary on ``PATH`` (torch runs it by name)."""
    if shutil.which("ninja") is None:
        with contextlib.suppress(ImportError, AttributeError):
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _compile(folder: BuildFolder) -> None:
    from torch.utils.cpp_extension import load

    _ninja_on_path()
    src = folder.path / "src"
    src.mkdir(exist_ok=True)
    copies = []
    for path in [*folder.sources, *HEADERS]:
        copy = src / path.name
        data = path.read_bytes()
        if not copy.exists() or copy.read_bytes() != data:
            copy.write_bytes(data)
        if path in folder.sources:
            copies.append(str(copy))
    with contextlib.suppress(FileNotFoundError):  # a killed build's: this process owns the folder
        (folder.path / "lock").unlink()
    load(name=folder.name, sources=copies, build_directory=str(folder.path),
         extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], is_python_module=False,
         verbose=False)


def build(folder: BuildFolder | None = None) -> bool:
    """Build the kernels into ``folder`` unless done; True when ``READY``; never raises."""
    folder = folder if folder is not None else BuildFolder()
    folder.path.mkdir(parents=True, exist_ok=True)
    if not take_lock(folder.lock, lambda: folder.state() in ("ready", "failed")):
        return folder.state() == "ready"
    done = threading.Event()
    threading.Thread(target=heartbeat, args=(folder.lock, done), daemon=True).start()
    try:
        if folder.state() == "ready":
            return True
        started = time.perf_counter()
        _compile(folder)
        folder.ready.write_text(folder.library.name + "\n", encoding="utf-8")
        logger.info("built the native CPU kernels %s in %.1f s", folder.path,
                    time.perf_counter() - started)
        return True
    except Exception as error:  # no compiler, no ninja, a failed build: stock kernels serve
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        with contextlib.suppress(OSError):
            folder.failed.write_text(f"{reason}\n{error}\n", encoding="utf-8")
        logger.warning("native CPU kernels unavailable (%s); using stock kernels", reason)
        return False
    finally:
        done.set()
        with contextlib.suppress(FileNotFoundError):
            folder.lock.unlink()


def build_in_background(folder: BuildFolder) -> subprocess.Popen[bytes] | None:
    """Start a niced child building ``folder``; None when building or failed before."""
    if folder.state() != "absent":
        return None
    folder.path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")])}
    with open(folder.log, "ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "aioserve.runners.cpu.native_build", str(folder.path.parent)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, cwd=folder.path)
    logger.info("building the native CPU kernels in the background (%s; stock kernels "
                "serve meanwhile)", folder.path)
    return child


if __name__ == "__main__":  # the background builder
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with contextlib.suppress(OSError):
        os.nice(10)
    sys.exit(0 if build(BuildFolder(root=Path(sys.argv[1]) if len(sys.argv) > 1 else None))
             else 1)
