"""What `trainwise doctor` knows about a machine: one `Facts` object, probed from torch, NVML (gpu_facts.py),
psutil, /proc and sysfs, and round-trippable through JSON so a machine's facts can be recorded to a file and
checked anywhere (tests check recorded T4, H200, multi-GPU and Docker machines on a laptop).

Probes only read; they never decide. Every decision is in checks.py, gpu_health.py and host.py.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainwise.data.loader import usable_cores
from trainwise.data.disk import DiskFacts, probe_disk
from trainwise.doctor.distributed_facts import DistributedFacts, probe_distributed
from trainwise.doctor.gpu_facts import NvmlFacts, probe_nvml
from trainwise.doctor.smoke import AllReduceFacts, run_all_reduce
from trainwise.errors import ConfigError

SCHEMA_VERSION = 1


@dataclass
class PythonFacts:
    version: str
    executable: str
    prefix: str
    base_prefix: str
    in_venv: bool
    conda_prefix: str | None = None
    """$CONDA_PREFIX when this interpreter is a conda env's."""
    numpy_version: str | None = None
    pip_check_ran: bool = False
    pip_conflicts: list[str] = field(default_factory=list)
    """Lines of `pip check` output naming broken requirements."""


@dataclass
class TorchDevice:
    index: int
    name: str
    capability: list[int]
    total_memory_bytes: int
    bf16_supported: bool


@dataclass
class TorchFacts:
    installed: bool
    version: str | None = None
    cuda: str | None = None
    """torch.version.cuda: the CUDA the wheel was built with; None for a CPU build."""
    hip: str | None = None
    cudnn_version: int | None = None
    nccl_available: bool = False
    nccl_version: str | None = None
    cuda_available: bool = False
    device_count: int = 0
    cuda_error: str | None = None
    """What torch said when CUDA failed to initialise (driver too old, no device ...)."""
    arch_list: list[str] = field(default_factory=list)
    """torch.cuda.get_arch_list(): the GPU architectures the wheel has kernels for."""
    tf32_matmul: bool = False
    tf32_cudnn: bool = False
    float32_matmul_precision: str = "highest"
    devices: list[TorchDevice] = field(default_factory=list)
    peer_access: list[list[bool]] | None = None
    all_reduce: AllReduceFacts | None = None


@dataclass
class HostFacts:
    os_id: str | None
    """/etc/os-release ID: ubuntu, debian, rhel ..."""
    os_version_id: str | None
    os_name: str | None
    kernel: str
    machine: str
    """x86_64, aarch64."""
    cpu_logical: int
    cpu_physical: int | None
    cpu_usable: int
    """Cores this process may run on (affinity / container limit)."""
    ram_total_bytes: int
    ram_available_bytes: int
    open_files_soft: int | None
    open_files_hard: int | None
    shm_total_bytes: int | None
    shm_free_bytes: int | None
    in_container: bool
    cuda_visible_devices: str | None
    nvidia_pci_devices: int
    """NVIDIA display/3D controllers on the PCI bus, seen without any driver."""
    nvidia_driver_loaded: bool


@dataclass
class Facts:
    python: PythonFacts
    torch: TorchFacts
    nvml: NvmlFacts
    host: HostFacts
    disk: DiskFacts
    schema_version: int = SCHEMA_VERSION
    recorded_at: str = ""
    description: str = ""
    """For recorded files: which machine this is."""
    distributed: DistributedFacts | None = None
    """For a job of several ranks (`--nproc`, or when the doctor runs inside one); None otherwise."""


# ---- JSON round trip -------------------------------------------------------------------------------
def _adapter():
    from pydantic import TypeAdapter

    return TypeAdapter(Facts)


def facts_to_dict(facts: Facts) -> dict[str, Any]:
    return _adapter().dump_python(facts, mode="json")


def facts_from_dict(raw: dict[str, Any]) -> Facts:
    from pydantic import ValidationError

    try:
        return _adapter().validate_python(raw)
    except ValidationError as error:
        raise ConfigError(f"not a trainwise facts record: {error.errors()[0]['loc']} "
                          f"{error.errors()[0]['msg']}. Record one with `trainwise doctor --record FILE`.") from None


def save_facts(facts: Facts, path: str | os.PathLike) -> Path:
    from trainwise.rundir.atomic import atomic_write_text

    return atomic_write_text(path, json.dumps(facts_to_dict(facts), indent=2) + "\n")


def load_facts(path: str | os.PathLike) -> Facts:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"facts file {path} does not exist.") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"facts file {path} is not JSON ({error.msg} at line {error.lineno}).") from None
    return facts_from_dict(raw)


# ---- probes ------------------------------------------------------------------------------------------
def collect_facts(data_dir: str | os.PathLike = ".", *, pip_check: bool = True, all_reduce: bool = True,
                  nproc: int | None = None, nnodes: int | None = None, num_workers: int | None = None) -> Facts:
    """Probe this machine (for a job of `nproc` ranks on `nnodes` machines, when given). Nothing here raises
    because a GPU, a driver or a library is missing."""
    nvml = probe_nvml()  # before torch creates CUDA contexts, so our own process does not look like a tenant
    all_reduce = all_reduce and os.environ.get("LOCAL_RANK", "0") == "0"  # in a job: one smoke test per machine
    facts = Facts(python=probe_python(pip_check=pip_check), torch=probe_torch(all_reduce=all_reduce),
                  nvml=nvml, host=probe_host(), disk=probe_disk(data_dir),
                  recorded_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  distributed=probe_distributed(nproc, nnodes, num_workers))
    names = sorted({g.name for g in nvml.gpus})
    gpus = f"{len(nvml.gpus)} x {', '.join(names)}" if names else "no NVIDIA GPU"
    facts.description = (f"Recorded by trainwise doctor: {facts.host.os_name or facts.host.os_id}, {gpus}, "
                         f"driver {nvml.driver_version or '-'}, torch {facts.torch.version or '-'}")
    return facts


def probe_python(*, pip_check: bool = True) -> PythonFacts:
    try:
        import numpy
        numpy_version = numpy.__version__
    except ImportError:
        numpy_version = None
    conda = os.environ.get("CONDA_PREFIX")
    facts = PythonFacts(version=platform.python_version(), executable=sys.executable, prefix=sys.prefix,
                        base_prefix=sys.base_prefix, in_venv=sys.prefix != sys.base_prefix,
                        conda_prefix=conda if conda and Path(conda).resolve() == Path(sys.prefix).resolve()
                        else None, numpy_version=numpy_version)
    if pip_check:
        try:
            done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True,
                                  timeout=60)
            facts.pip_check_ran = "No module named pip" not in done.stderr
            if done.returncode != 0 and facts.pip_check_ran:
                facts.pip_conflicts = [line for line in done.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return facts


def probe_torch(*, all_reduce: bool = True) -> TorchFacts:
    try:
        import torch
    except ImportError:
        return TorchFacts(installed=False)
    import torch.distributed

    facts = TorchFacts(installed=True, version=torch.__version__, cuda=torch.version.cuda,
                       hip=getattr(torch.version, "hip", None),
                       nccl_available=torch.distributed.is_available() and torch.distributed.is_nccl_available(),
                       tf32_matmul=torch.backends.cuda.matmul.allow_tf32, tf32_cudnn=torch.backends.cudnn.allow_tf32,
                       float32_matmul_precision=torch.get_float32_matmul_precision())
    with warnings.catch_warnings(record=True) as caught:  # torch warns, not raises, when CUDA init fails
        warnings.simplefilter("always")
        facts.cuda_available = torch.cuda.is_available()
        facts.device_count = torch.cuda.device_count() if facts.cuda_available else 0
    messages = [str(w.message) for w in caught if "CUDA" in str(w.message) or "driver" in str(w.message)]
    facts.cuda_error = messages[0] if messages else None
    if facts.cuda is not None:
        try:
            facts.cudnn_version = torch.backends.cudnn.version()
        except RuntimeError as error:
            facts.cuda_error = facts.cuda_error or str(error)
        if facts.nccl_available:
            try:
                version = torch.cuda.nccl.version()
                facts.nccl_version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
            except (RuntimeError, AttributeError):
                pass
    if not facts.cuda_available:
        return facts
    facts.arch_list = list(torch.cuda.get_arch_list())
    for i in range(facts.device_count):
        props = torch.cuda.get_device_properties(i)
        facts.devices.append(TorchDevice(index=i, name=props.name, capability=[props.major, props.minor],
                                         total_memory_bytes=props.total_memory,
                                         bf16_supported=props.major >= 8))
    if facts.device_count >= 2:
        facts.peer_access = [[i == j or torch.cuda.can_device_access_peer(i, j)
                              for j in range(facts.device_count)] for i in range(facts.device_count)]
        if all_reduce:
            facts.all_reduce = run_all_reduce(world_size=facts.device_count,
                                              backend="nccl" if facts.nccl_available else "gloo")
    return facts


def probe_host() -> HostFacts:
    import psutil

    try:
        release = platform.freedesktop_os_release()
    except OSError:
        release = {}
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError):
        soft = hard = None
    try:
        shm = psutil.disk_usage("/dev/shm")
        shm_total, shm_free = shm.total, shm.free
    except OSError:
        shm_total = shm_free = None
    memory = psutil.virtual_memory()
    return HostFacts(
        os_id=release.get("ID"), os_version_id=release.get("VERSION_ID"), os_name=release.get("PRETTY_NAME"),
        kernel=platform.release(), machine=platform.machine(), cpu_logical=os.cpu_count() or 1,
        cpu_physical=psutil.cpu_count(logical=False),
        cpu_usable=usable_cores(),
        ram_total_bytes=memory.total, ram_available_bytes=memory.available,
        open_files_soft=_limit(soft), open_files_hard=_limit(hard), shm_total_bytes=shm_total,
        shm_free_bytes=shm_free, in_container=_in_container(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        nvidia_pci_devices=_nvidia_pci_devices(), nvidia_driver_loaded=Path("/proc/driver/nvidia/version").exists(),
    )


def _nvidia_pci_devices() -> int:
    count = 0
    for device in Path("/sys/bus/pci/devices").glob("*"):
        try:
            vendor = (device / "vendor").read_text().strip()
            klass = (device / "class").read_text().strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass.startswith(("0x0300", "0x0302")):  # VGA or 3D controller
            count += 1
    return count


def _in_container() -> bool:
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    try:
        return any(word in Path("/proc/1/cgroup").read_text() for word in ("docker", "kubepods", "containerd"))
    except OSError:
        return False


def _limit(value: int | None) -> int | None:
    import resource

    return None if value is None or value == resource.RLIM_INFINITY else int(value)
