"""Issue 26, item 1: the default thread count is what the process may really use (its
CPU affinity and its cgroup's CPU quota), with AIOSERVE_NUM_THREADS overriding it.

The cgroup files are fakes under tmp_path, laid out as the kernel mounts them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from aioserve.runners.cpu.threads import cpu_budget
from aioserve.runners.cpu.threads.cpu_budget import cgroup_cpu_quota, usable_cpus
from aioserve.runners.torch.setup import cpu_threads

CPU = torch.device("cpu")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    for name, text in files.items():
        write(root / name, text)
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(proc_cgroup)
    return root, proc


@pytest.fixture
def eight_cpus(monkeypatch):
    monkeypatch.setattr(cpu_budget, "affinity_cpus", lambda: frozenset(range(8)))


def test_cgroup_v2_quota_rounds_up_and_the_smallest_ancestor_wins(tmp_path, eight_cpus):
    root, proc = fake(tmp_path, "0::/app/worker\n", {
        "cgroup.controllers": "cpu memory",
        "app/cpu.max": "250000 100000\n",  # 2.5 CPUs for the parent
        "app/worker/cpu.max": "max 100000\n",  # no limit of its own
    })
    assert cgroup_cpu_quota(proc.read_text(), root) == 2.5
    assert usable_cpus(root, proc) == 3
    write(root / "app/worker/cpu.max", "150000 100000\n")
    assert usable_cpus(root, proc) == 2
    write(root / "app/worker/cpu.max", "20000 100000\n")  # 0.2 CPUs: still one thread
    assert usable_cpus(root, proc) == 1


def test_no_quota_leaves_the_affinity(tmp_path, eight_cpus):
    root, proc = fake(tmp_path, "0::/svc\n", {"svc/cpu.max": "max 100000\n"})
    assert cgroup_cpu_quota(proc.read_text(), root) is None
    assert usable_cpus(root, proc) == 8
    root2, proc2 = fake(tmp_path / "b", "0::/svc\n", {})  # no cpu controller files at all
    assert usable_cpus(root2, proc2) == 8


def test_cgroup_v1_quota_and_a_container_that_sees_its_own_cgroup_at_the_root(
        tmp_path, eight_cpus):
    # the host's path does not exist inside the container: the mount root is its cgroup
    root, proc = fake(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "150000\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert cgroup_cpu_quota(proc.read_text(), root) == 1.5
    assert usable_cpus(root, proc) == 2
    write(root / "cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    assert usable_cpus(root, proc) == 8


def test_hybrid_hierarchy_reads_v1_cpu_and_the_unified_mount(tmp_path, eight_cpus):
    root, proc = fake(tmp_path, "1:cpu:/\n0::/user.slice\n", {
        "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n",
        "unified/user.slice/cpu.max": "300000 100000\n",
    })
    assert usable_cpus(root, proc) == 3


def test_affinity_below_the_quota_wins(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_budget, "affinity_cpus", lambda: frozenset({2, 5}))
    root, proc = fake(tmp_path, "0::/\n", {"cpu.max": "400000 100000\n"})
    assert usable_cpus(root, proc) == 2


def test_garbage_files_are_no_limit(tmp_path, eight_cpus):
    root, proc = fake(tmp_path, "0::/x\nnot a line\n", {
        "x/cpu.max": "lots\n", "cpu.max": "1 2 3\n"})
    assert usable_cpus(root, proc) == 8


def test_the_default_thread_count_is_the_usable_cpus_and_the_variable_overrides_it(
        monkeypatch):
    monkeypatch.delenv("AIOSERVE_NUM_THREADS", raising=False)
    assert cpu_threads(CPU) == usable_cpus() <= (os.cpu_count() or 1)
    monkeypatch.setattr("aioserve.runners.torch.setup.usable_cpus", lambda: 3)
    assert cpu_threads(CPU) == 3
    monkeypatch.setenv("AIOSERVE_NUM_THREADS", "5")
    assert cpu_threads(CPU) == 5
    assert cpu_threads(torch.device("meta")) == 5  # off the CPU: only the variable
    monkeypatch.delenv("AIOSERVE_NUM_THREADS")
    assert cpu_threads(torch.device("meta")) is None
