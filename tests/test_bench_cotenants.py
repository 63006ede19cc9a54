"""The contention benchmark's busy co-tenants always end: on leaving the ``with`` block,
on an exception, and when the benchmark itself is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from aioserve.bench.cotenants import CoTenants


def gone(pid: int, timeout: float = 30.0) -> bool:
    """Whether ``pid`` is gone (or a zombie) within ``timeout`` seconds (a bound)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


def test_they_end_with_the_block_and_on_an_exception():
    with CoTenants(2) as tenants:
        procs = list(tenants.procs)
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs) and tenants.procs == []
    with pytest.raises(RuntimeError), CoTenants(1) as tenants:
        procs = list(tenants.procs)
        raise RuntimeError("the benchmark failed")
    assert procs[0].poll() is not None
    with pytest.raises(ValueError):
        CoTenants(-1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_they_die_with_a_killed_benchmark():
    code = ("import sys, time; from aioserve.bench.cotenants import CoTenants; "
            "t = CoTenants(1); t.start(); print(t.procs[0].pid, flush=True); time.sleep(600)")
    bench = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        tenant = int(bench.stdout.readline())
        assert not gone(tenant, timeout=0.2)
    finally:
        bench.send_signal(signal.SIGKILL)
        bench.wait()
    assert gone(tenant)
