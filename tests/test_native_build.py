"""Issue 26, item 3: the compiled CPU kernels are never compiled on the serving path,
each environment has its own build folder, one build runs at a time per folder, and a
process that started without them switches them in only when no request runs."""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from server_support import wait_until

from aioserve import AsyncEngine, EngineConfig, SamplingParams
from aioserve.runners.cpu import build_lock, native_build, native_kernels
from aioserve.runners.cpu.native_build import BuildFolder, build, environment_key


def test_the_folder_depends_on_sources_interpreter_and_compiler(monkeypatch, tmp_path):
    key = environment_key()
    assert environment_key() == key
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "another-venv"))
    assert environment_key() != key
    monkeypatch.undo()
    monkeypatch.setenv("CXX", "/bin/true")  # another compiler
    assert environment_key() != key
    monkeypatch.delenv("CXX")
    source = tmp_path / "decode_attention.cpp"
    source.write_text("// changed")
    assert environment_key([source]) != environment_key()
    assert BuildFolder(root=tmp_path).path.parent == tmp_path


@pytest.fixture
def fake_compile(monkeypatch):
    """Compiling is torch's loader (15-60 s); these tests check what is around it."""
    calls = []

    def compile_(folder: BuildFolder) -> None:
        calls.append(folder.lock.read_text().split())
        folder.library.write_bytes(b"\x7fELF")

    monkeypatch.setattr(native_build, "_compile", compile_)
    return calls


def test_a_build_writes_ready_once_and_releases_its_lock(tmp_path, fake_compile):
    folder = BuildFolder(root=tmp_path)
    assert folder.state() == "absent"
    assert build(folder) and build(folder)
    assert len(fake_compile) == 1 and fake_compile[0] == [str(os.getpid()), socket.gethostname()]
    assert folder.state() == "ready" and not folder.lock.exists()


def test_a_killed_builders_lock_is_taken_over(tmp_path, fake_compile):
    folder = BuildFolder(root=tmp_path)
    folder.path.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    folder.lock.write_text(f"{dead} {socket.gethostname()}\n")
    (folder.path / "lock").touch()  # torch's own, left by the killed build
    assert folder.state() == "absent"
    assert build(folder) and len(fake_compile) == 1


def test_another_hosts_lock_is_waited_for_until_stale(tmp_path, fake_compile, caplog):
    folder = BuildFolder(root=tmp_path)
    folder.path.mkdir(parents=True)
    folder.lock.write_text("1 some-other-host\n")
    old = time.time() - build_lock.STALE_LOCK_S - 60
    os.utime(folder.lock, (old, old))
    assert folder.state() == "building"
    assert build(folder) and "stale build lock" in caplog.text


def test_a_failed_build_is_recorded_and_not_retried(tmp_path, monkeypatch, caplog):
    missing = tmp_path / "missing.cpp"
    folder = BuildFolder(sources=[missing], root=tmp_path)
    assert build(folder) is False
    assert folder.state() == "failed" and "stock kernels" in caplog.text
    monkeypatch.setattr(native_kernels, "BuildFolder", lambda: folder)
    monkeypatch.setattr(native_build, "build_in_background", pytest.fail)
    assert native_kernels._first_use() is False
    assert "build failed" in caplog.text


def test_a_fresh_environment_serves_at_once_and_builds_in_the_background(tmp_path):
    code = ("from aioserve.runners.cpu import native_kernels as n; "
            "print(n.available(), n._builder.pid if n._builder else 0)")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=120).stdout.split()
    builder = int(out[1])
    try:
        assert out[0] == "False" and builder > 0  # answered before any compile: a child builds
        folder = BuildFolder(root=tmp_path)
        assert folder.state() in ("building", "absent")  # absent: the lock not yet written
    finally:
        if builder:
            os.killpg(builder, signal.SIGKILL)  # the builder and its compiler
    for _ in range(100):  # reaped by init: its lock names a dead process
        if folder.state() == "absent":
            break
        time.sleep(0.1)
    assert folder.state() == "absent"


@pytest.fixture
def pending_build(monkeypatch):
    """A background build that reports "building" until the test sets ``state[0] =
    "ready"``: returns (state, folder)."""
    if not native_kernels.available():
        pytest.skip("the native CPU kernels did not build here")
    gc.collect()  # runners of earlier tests, which would count as busy
    state = ["building"]
    folder = BuildFolder()
    monkeypatch.setattr(folder, "state", lambda: state[0])
    monkeypatch.setattr(native_kernels, "_active", False)
    monkeypatch.setattr(native_kernels, "_pending", folder)
    return state, folder


async def test_kernels_built_meanwhile_switch_in_when_no_request_runs(
        model_dir, pending_build, solo_greedy):
    state, _ = pending_build
    prompt = [1, *range(40, 60)]  # 21 tokens: one full block for the prefix cache
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    config = EngineConfig(model=model_dir, device="cpu", num_kv_blocks=64, max_num_seqs=4)
    async with AsyncEngine(config) as engine:
        runner, core = engine.runner, engine.core
        assert runner.lean is not None and not runner.lean.native
        on_idle, switches = runner.on_idle, []

        def watched() -> bool:
            switched = on_idle()
            if switched:  # what the engine had started at that moment
                switches.append(len(core.running) + len(core.waiting) + core.num_preemptions)
            return switched

        runner.on_idle = watched
        first = []
        async for out in engine.generate(prompt, params):
            first += out.token_ids
            if len(first) == 1:
                state[0] = "ready"  # the build finishes mid-stream
                assert core.running  # (still computing: the switch must wait)
        second = []
        async for out in engine.generate(prompt, params):
            second += out.token_ids
            cached = out.num_cached_tokens
        assert switches == [0]  # once, with nothing started
        assert native_kernels._active is True and runner.lean.native
        assert cached == 0  # the stock kernels' prefix blocks were dropped at the switch
    assert first == second == solo_greedy(prompt, 20)


async def test_an_idle_engine_switches_when_the_build_finishes_and_says_so(
        model_dir, pending_build, caplog):
    state, folder = pending_build
    caplog.set_level(logging.INFO, logger="aioserve.runners.cpu.native_kernels")
    config = EngineConfig(model=model_dir, device="cpu", num_kv_blocks=64, max_num_seqs=4)
    async with AsyncEngine(config) as engine:
        runner = engine.runner
        await wait_until(engine.step_loop.idle.is_set)
        assert runner.idle_poll_s == 1.0 and not runner.lean.native
        state[0] = "ready"  # the build finishes while no request comes
        await wait_until(lambda: runner.lean.native, timeout=30)
        assert runner.idle_poll_s is None  # done: the idle engine waits for work alone
    switched = [r for r in caplog.records if "switched" in r.getMessage()]
    assert len(switched) == 1 and switched[0].levelno == logging.INFO
    assert switched[0].getMessage() == ("the native CPU kernels' background build finished: "
                                        f"switched to them ({folder.path})")


def test_a_failed_background_build_says_the_stock_kernels_keep_serving(tmp_path, monkeypatch,
                                                                        caplog):
    folder = BuildFolder(sources=[tmp_path / "missing.cpp"], root=tmp_path)
    assert build(folder) is False  # FAILED written, as the background builder does
    monkeypatch.setattr(native_kernels, "_active", False)
    monkeypatch.setattr(native_kernels, "_pending", folder)
    caplog.clear()
    assert native_kernels.activate() is False
    [line] = [r for r in caplog.records if r.name == "aioserve.runners.cpu.native_kernels"]
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith("the native CPU kernels' build failed (")
    assert line.getMessage().endswith("the stock kernels keep serving")
    assert native_kernels._pending is None and not native_kernels.available()


def test_a_slow_build_keeps_its_lock_fresh(tmp_path, monkeypatch):
    from aioserve.runners.cpu import build_lock

    monkeypatch.setattr(build_lock, "HEARTBEAT_S", 0.01)
    touched = []

    def slow_compile(folder: BuildFolder) -> None:
        old = time.time() - 3600
        os.utime(folder.lock, (old, old))  # as if the build had run for an hour
        deadline = time.monotonic() + 60
        while time.time() - folder.lock.stat().st_mtime > 60 and time.monotonic() < deadline:
            time.sleep(0.01)
        touched.append(time.time() - folder.lock.stat().st_mtime < 60)
        folder.library.write_bytes(b"\x7fELF")

    monkeypatch.setattr(native_build, "_compile", slow_compile)
    assert build(BuildFolder(root=tmp_path)) and touched == [True]


def test_a_closed_runner_does_not_hold_the_switch_back(monkeypatch):
    """A runner shut down mid-step stays busy, and something may keep it alive (aiohttp
    caches its last 1,024 apps, with their engines): closed, it no longer counts."""
    import weakref

    switched = []
    monkeypatch.setattr(native_kernels.KernelSwitch, "_runners", weakref.WeakSet())
    monkeypatch.setattr(native_kernels, "_pending", BuildFolder())
    monkeypatch.setattr(native_kernels, "activate", lambda: switched.append(1) or True)
    closed, live = native_kernels.KernelSwitch(), native_kernels.KernelSwitch()
    closed.busy()
    assert live.idle() is False and switched == []
    closed.close()
    assert live.idle() is True and switched == [1]
