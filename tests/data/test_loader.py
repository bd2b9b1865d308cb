"""Loader sizing: the usable core count, what `auto` starts on a machine's cores, RAM and /dev/shm, and the bound
on a count the user gives."""
from __future__ import annotations

import pytest
import torch

import trainwise.data.loader as loader
from trainwise.data.loader import (MAX_AUTO_WORKERS, auto_workers, cgroup_cpu_quota, choose_loader_settings,
                                   max_workers, usable_cores)
from trainwise.errors import ConfigError

GIB, MIB = 2**30, 2**20
CPU = torch.device("cpu")


@pytest.fixture
def machine(monkeypatch):
    """A machine of `cores` usable cores and the given free RAM and /dev/shm."""
    def set_machine(cores: int, ram: int | None = 64 * GIB, shm: int | None = 32 * GIB) -> None:
        monkeypatch.setattr(loader.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        monkeypatch.setattr(loader, "cgroup_cpu_quota", lambda: None)
        monkeypatch.setattr(loader, "_free_memory", lambda: (ram, shm))
    return set_machine


def test_a_container_cpu_quota_caps_the_affinity(monkeypatch):
    monkeypatch.setattr(loader.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(loader, "cgroup_cpu_quota", lambda: 3)  # docker run --cpus=2.5 on a 64-core host
    assert usable_cores() == 3


@pytest.mark.parametrize("files, cores", [
    ({"cpu.max": "250000 100000\n"}, 3), ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None), ({}, None),
])
def test_cgroup_quota_v2_and_v1(tmp_path, files, cores):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == cores


def test_auto_leaves_a_core_to_training_and_splits_cores_between_gpus():
    assert auto_workers(16) == MAX_AUTO_WORKERS
    assert auto_workers(4) == 3
    assert auto_workers(16, gpus=4) == 3
    assert auto_workers(1) == 0


def test_auto_fits_the_workers_in_ram_and_shared_memory():
    # Docker's default 64 MB /dev/shm holds no worker's ready batches: workers would die with "Bus error"
    assert auto_workers(16, shm_free_bytes=64 * MIB) == 0
    # 1 GiB of shm, half of it usable, 4 ready batches of 16 MiB per worker
    assert auto_workers(16, shm_free_bytes=1 * GIB, batch_bytes=16 * MIB) == 8
    assert auto_workers(16, shm_free_bytes=1 * GIB, batch_bytes=64 * MIB) == 2
    assert auto_workers(16, ram_available_bytes=1 * GIB) == 2  # half of 1 GiB at 256 MiB a worker
    assert auto_workers(16, gpus=2, ram_available_bytes=2 * GIB) == 2  # two training processes share it


def test_auto_settings_use_the_machine_facts(machine):
    machine(16, shm=64 * MIB)
    assert choose_loader_settings(CPU, "auto").num_workers == 0
    machine(16)
    settings = choose_loader_settings(CPU, "auto")
    assert settings.num_workers == MAX_AUTO_WORKERS and settings.automatic


@pytest.mark.parametrize("count", [2147483648, 9])
def test_a_count_beyond_two_per_core_is_refused_before_any_fork(machine, count):
    machine(4)
    with pytest.raises(ConfigError) as error:
        choose_loader_settings(CPU, count)
    message = str(error.value)
    assert f"data.num_workers={count}" in message and "4 cores" in message and "at most 8" in message
    assert "data.num_workers=auto" in message


def test_counts_within_the_bound_are_kept(machine):
    machine(4)
    assert max_workers(4) == 8
    assert choose_loader_settings(CPU, 8).num_workers == 8
    assert choose_loader_settings(CPU, "2").num_workers == 2  # from a command line
    assert choose_loader_settings(CPU, 0).num_workers == 0


@pytest.mark.parametrize("count", [-1, 1.5, True])
def test_a_count_that_is_not_one_is_refused(machine, count):
    machine(4)
    with pytest.raises(ConfigError, match="give auto, 0"):
        choose_loader_settings(CPU, count)
