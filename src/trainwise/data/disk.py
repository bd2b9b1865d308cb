"""Is this directory a good home for training data? Same filesystem as the system disk, free space,
spinning disk or SSD.

`probe_disk` reads the system (os.stat, psutil, sysfs) into a `DiskFacts`; `disk_findings` decides from the
facts alone, so every branch is tested on recorded facts. `check_data_dir` is both, for `trainwise prepare`
and `trainwise doctor --data-dir`.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from trainwise.findings import Finding
from trainwise.errors import ConfigError

GIB = 2**30
FREE_FAIL_BYTES = 1 * GIB  # below this, writing shards or checkpoints will fail soon
FREE_WARN_BYTES = 20 * GIB
FREE_WARN_FRACTION = 0.05  # ext4 and friends slow down and fragment when nearly full
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "fuse.sshfs", "9p", "glusterfs", "ceph", "fuse.s3fs",
                       "fuse.gcsfuse", "fuse.rclone", "beegfs", "lustre")


@dataclass
class DiskFacts:
    path: str
    """The directory asked about, absolute."""
    probed_path: str
    """The nearest existing directory at or above `path` (the data dir may not exist yet)."""
    exists: bool
    device: str
    """major:minor of the filesystem holding `probed_path`."""
    root_device: str
    """major:minor of the filesystem holding `/`, the system disk."""
    mount_point: str | None = None
    filesystem: str | None = None
    """ext4, xfs, overlay, nfs4 ... (from the mount table)."""
    source: str | None = None
    """What is mounted there: /dev/nvme1n1p1, overlay, server:/export."""
    block_device: str | None = None
    """Whole disk behind the filesystem (nvme1n1, sda, vda); None for overlay/network/tmpfs."""
    root_block_device: str | None = None
    rotational: bool | None = None
    """sysfs queue/rotational: True for a spinning disk; None when unknown."""
    virtual_disk: bool = False
    """virtio/Xen disk: the kernel reports it rotational whatever the host storage is."""
    free_bytes: int = 0
    total_bytes: int = 0
    writable: bool = True


def check_data_dir(path: str | os.PathLike, *, required_bytes: int | None = None) -> list[Finding]:
    """Findings about `path` as a data directory. `required_bytes`: what is about to be written there."""
    return disk_findings(probe_disk(path), required_bytes=required_bytes)


# ---- decisions (pure) ----------------------------------------------------------------------------------
def disk_findings(facts: DiskFacts, *, required_bytes: int | None = None) -> list[Finding]:
    return [_system_disk(facts), _free_space(facts, required_bytes), _disk_kind(facts)]


def _system_disk(f: DiskFacts) -> Finding:
    evidence = {"path": f.path, "mount_point": f.mount_point, "filesystem": f.filesystem, "source": f.source,
                "device": f.device, "root_device": f.root_device}
    fix = ("Keep the data on a separate data disk, e.g. one mounted at /mnt/data (`lsblk -o NAME,SIZE,ROTA,"
           "MOUNTPOINT` lists the disks), and point trainwise there (`doctor --data-dir`, `prepare --to`).")
    if f.filesystem in NETWORK_FILESYSTEMS:
        return Finding("data_disk", "warn", "Data disk",
                       f"{f.path} is on a network filesystem ({f.filesystem}): every epoch "
                       "reads it over the network", evidence,
                       f"Copy the prepared shards to a local SSD first, e.g. `rsync -a {f.path}/ /mnt/local/data/`.")
    if f.device == f.root_device:
        return Finding("data_disk", "warn", "Data disk",
                       f"{f.path} is on the system disk (same filesystem as /): a full disk "
                       "stops the OS and the data competes with it for I/O", evidence, fix)
    if f.block_device and f.block_device == f.root_block_device:
        return Finding("data_disk", "warn", "Data disk", f"{f.path} is on another partition of the system disk "
                       f"({f.block_device}): it shares the disk's I/O with the OS", evidence, fix)
    return Finding("data_disk", "info", "Data disk",
                   f"{f.path} is on its own filesystem ({f.source or f.device}), not the "
                   "system disk", evidence)


def _free_space(f: DiskFacts, required_bytes: int | None) -> Finding:
    free_gib, total_gib = f.free_bytes / GIB, f.total_bytes / GIB
    evidence = {"path": f.probed_path, "free_bytes": f.free_bytes, "total_bytes": f.total_bytes,
                "required_bytes": required_bytes}
    where = f"{free_gib:.1f} GiB free of {total_gib:.1f} GiB on {f.mount_point or f.probed_path}"
    fix = f"Free space (`du -xh --max-depth=1 {f.mount_point or f.probed_path} | sort -h | tail`) or choose a " \
          "bigger disk."
    if not f.writable:
        return Finding("free_space", "error", "Free space", f"{f.probed_path} is not writable by this user", evidence,
                       f"Choose a writable directory or `sudo chown -R $USER {f.probed_path}`.")
    if required_bytes is not None and f.free_bytes < required_bytes:
        return Finding("free_space", "error", "Free space", f"{where}, but {required_bytes / GIB:.1f} GiB are needed",
                       evidence, fix)
    if f.free_bytes < FREE_FAIL_BYTES:
        return Finding("free_space", "error", "Free space",
                       f"only {where}: shards and checkpoints will not fit", evidence, fix)
    if f.free_bytes < FREE_WARN_BYTES or (f.total_bytes and f.free_bytes < FREE_WARN_FRACTION * f.total_bytes):
        return Finding("free_space", "warn", "Free space",
                       f"{where}: little room for shards and checkpoints", evidence, fix)
    return Finding("free_space", "info", "Free space", where, evidence)


def _disk_kind(f: DiskFacts) -> Finding:
    evidence = {"block_device": f.block_device, "rotational": f.rotational, "virtual_disk": f.virtual_disk,
                "filesystem": f.filesystem}
    if f.block_device is None:
        return Finding("disk_type", "info", "Disk type",
                       f"no local block device behind {f.filesystem or 'this filesystem'}; "
                       "its speed cannot be read from sysfs", evidence, _measure_fix(f))
    if f.virtual_disk:
        return Finding("disk_type", "info", "Disk type",
                       f"{f.block_device} is a virtual disk: the kernel cannot tell whether "
                       "the host storage is SSD or HDD", evidence, _measure_fix(f))
    if f.rotational:
        return Finding("disk_type", "warn", "Disk type", f"{f.block_device} is a spinning disk (HDD): random reads of "
                       "samples are ~100x slower than on an SSD", evidence,
                       "Move the data to an SSD/NVMe disk, or read it sequentially from large shards "
                       "(`trainwise prepare` writes them) with several DataLoader workers.")
    if f.rotational is None:
        return Finding("disk_type", "info", "Disk type",
                       f"{f.block_device}: sysfs does not say whether it spins", evidence,
                       _measure_fix(f))
    kind = "NVMe SSD" if f.block_device.startswith("nvme") else "SSD"
    return Finding("disk_type", "info", "Disk type", f"{f.block_device} is an {kind}", evidence)


def _measure_fix(f: DiskFacts) -> str:
    return (f"Measure it: `fio --name=read --rw=randread --bs=128k --size=1G --direct=1 "
            f"--filename={f.probed_path}/fio.test && rm {f.probed_path}/fio.test`.")


# ---- probe (reads the system) --------------------------------------------------------------------------
def probe_disk(path: str | os.PathLike) -> DiskFacts:
    """Read the facts about `path`'s filesystem and disk. Never raises on a missing sysfs entry."""
    asked = Path(path).expanduser().absolute()
    if asked.exists() and not asked.is_dir():
        raise ConfigError(f"{asked} is a file; the data directory must be a directory (or not exist yet).")
    probed = asked
    while not probed.exists() and probed != probed.parent:
        probed = probed.parent
    probed = Path(os.path.realpath(probed))
    stat, root_stat = os.stat(probed), os.stat("/")
    mount = _mount_of(probed)
    root_mount = _mount_of(Path("/"))
    usage = shutil.disk_usage(probed)
    disk = _block_device(stat.st_dev, mount.device if mount else None)
    root_disk = _block_device(root_stat.st_dev, root_mount.device if root_mount else None)
    return DiskFacts(
        path=str(asked), probed_path=str(probed), exists=asked.exists(),
        device=_dev(stat.st_dev), root_device=_dev(root_stat.st_dev),
        mount_point=mount.mountpoint if mount else None, filesystem=mount.fstype if mount else None,
        source=mount.device if mount else None,
        block_device=disk[0] if disk else None, root_block_device=root_disk[0] if root_disk else None,
        rotational=_read_rotational(disk[1]) if disk else None, virtual_disk=bool(disk and _is_virtual(*disk)),
        free_bytes=usage.free, total_bytes=usage.total, writable=os.access(probed, os.W_OK),
    )


def _dev(st_dev: int) -> str:
    return f"{os.major(st_dev)}:{os.minor(st_dev)}"


def _mount_of(path: Path):
    import psutil

    best = None
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (str(path) == mp or str(path).startswith(mp.rstrip("/") + "/")) and (
                best is None or len(mp) >= len(best.mountpoint)):
            best = part  # the last, longest match is the mount that is visible
    return best


def _block_device(st_dev: int, source: str | None) -> tuple[str, Path] | None:
    """(whole-disk name, its sysfs dir) behind a filesystem, or None (overlay, tmpfs, network)."""
    candidates = [st_dev]
    if source and source.startswith("/dev/"):
        try:
            candidates.append(os.stat(source).st_rdev)
        except OSError:
            pass
    for dev in candidates:
        sys_dir = Path(f"/sys/dev/block/{_dev(dev)}")
        if os.major(dev) == 0 or not sys_dir.exists():
            continue
        sys_dir = sys_dir.resolve()
        if (sys_dir / "partition").exists():  # a partition: its disk is the parent directory
            sys_dir = sys_dir.parent
        return sys_dir.name, sys_dir
    return None


def _read_rotational(sys_dir: Path) -> bool | None:
    try:
        return (sys_dir / "queue" / "rotational").read_text().strip() == "1"
    except OSError:
        return None


def _is_virtual(name: str, sys_dir: Path) -> bool:
    return name.startswith(("vd", "xvd")) or "/virtio" in str(sys_dir)
