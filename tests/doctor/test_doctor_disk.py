"""Data-directory checks: decisions on written facts, and the probe on this machine."""
import os
import shutil

import pytest

from trainwise.data.disk import GIB, DiskFacts, check_data_dir, disk_findings, probe_disk


def facts(**changes) -> DiskFacts:
    base = dict(path="/mnt/data/run", probed_path="/mnt/data", exists=False, device="259:3", root_device="259:1",
                mount_point="/mnt/data", filesystem="ext4", source="/dev/nvme1n1p1", block_device="nvme1n1",
                root_block_device="nvme0n1", rotational=False, virtual_disk=False,
                free_bytes=800 * GIB, total_bytes=1800 * GIB)
    return DiskFacts(**{**base, **changes})


def by_title(findings):
    return {f.title: f for f in findings}


def test_separate_nvme_data_disk_is_all_ok():
    found = by_title(disk_findings(facts()))
    assert [f.severity for f in found.values()] == ["info", "info", "info"]
    assert "NVMe" in found["Disk type"].detail


def test_data_on_the_system_disk_warns_with_a_way_out():
    found = by_title(disk_findings(facts(device="259:1", block_device="nvme0n1")))["Data disk"]
    assert found.severity == "warn" and "system disk" in found.detail
    assert "--data-dir" in found.fixes[0] and "lsblk" in found.fixes[0]


def test_another_partition_of_the_system_disk_warns():
    found = by_title(disk_findings(facts(block_device="nvme0n1")))["Data disk"]
    assert found.severity == "warn" and "partition" in found.detail


def test_network_filesystem_warns():
    found = by_title(disk_findings(facts(filesystem="nfs4", block_device=None, source="nas:/export")))
    assert found["Data disk"].severity == "warn" and "network" in found["Data disk"].detail


@pytest.mark.parametrize("free, required, status", [
    (800 * GIB, None, "info"), (15 * GIB, None, "warn"), (50 * GIB, None, "warn"),  # 50 of 1800 GiB < 5%
    (GIB // 2, None, "error"), (100 * GIB, 200 * GIB, "error"), (300 * GIB, 200 * GIB, "info")])
def test_free_space_thresholds(free, required, status):
    found = by_title(disk_findings(facts(free_bytes=free), required_bytes=required))["Free space"]
    assert found.severity == status
    if status != "info":
        assert found.fixes


def test_read_only_directory_fails():
    assert by_title(disk_findings(facts(writable=False)))["Free space"].severity == "error"


def test_spinning_disk_warns_but_virtual_disk_does_not():
    assert by_title(disk_findings(facts(block_device="sdb", rotational=True)))["Disk type"].severity == "warn"
    virtual = by_title(disk_findings(facts(block_device="vdb", rotational=True, virtual_disk=True)))["Disk type"]
    assert virtual.severity == "info" and "virtual" in virtual.detail and "fio" in virtual.fixes[0]


def test_probe_on_this_machine_matches_os_stat(tmp_path):
    target = tmp_path / "not" / "yet" / "made"
    got = probe_disk(target)
    assert not got.exists and got.probed_path == os.path.realpath(tmp_path)
    st, root = os.stat(tmp_path), os.stat("/")
    assert (got.device == got.root_device) == (st.st_dev == root.st_dev)
    assert abs(got.total_bytes - shutil.disk_usage(tmp_path).total) < GIB


def test_check_data_dir_returns_the_three_findings(tmp_path):
    found = check_data_dir(tmp_path)
    assert [f.title for f in found] == ["Data disk", "Free space", "Disk type"]
    assert all(f.severity in ("info", "warn", "error") for f in found)
