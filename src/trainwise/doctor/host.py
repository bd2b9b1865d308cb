"""Host checks, pure over `HostFacts`: CPU cores per GPU, RAM, open-file limit, /dev/shm."""
from __future__ import annotations

from typing import TYPE_CHECKING

from trainwise.data.loader import auto_workers
from trainwise.findings import Finding

if TYPE_CHECKING:  # facts.py imports the distributed checks, which use size_text from here
    from trainwise.doctor.facts import HostFacts

GIB = 2**30
MIN_CORES_PER_GPU = 4  # below this, decoding + augmentation rarely keeps a modern GPU fed
MIN_OPEN_FILES = 4096  # DataLoader workers share tensors through file descriptors
MIN_SHM_BYTES = 1 * GIB  # Docker's 64 MB default kills workers with "Bus error"


def suggested_workers(cores: int, gpus: int, *, ram_available_bytes: int | None = None,
                      shm_free_bytes: int | None = None) -> int:
    """DataLoader workers per training process: the rule `data.num_workers: auto` applies, on the same facts."""
    return auto_workers(cores, gpus, ram_available_bytes=ram_available_bytes, shm_free_bytes=shm_free_bytes)


def host_findings(host: HostFacts, *, gpus: int, gpu_memory_bytes: int = 0) -> list[Finding]:
    return [cpu_cores(host, gpus), ram(host, gpu_memory_bytes), open_files(host), shared_memory(host)]


def cpu_cores(h: HostFacts, gpus: int) -> Finding:
    workers = suggested_workers(h.cpu_usable, gpus, ram_available_bytes=h.ram_available_bytes,
                                shm_free_bytes=h.shm_free_bytes)
    limited = f" (of {h.cpu_logical} on the machine)" if h.cpu_usable < h.cpu_logical else ""
    evidence = {"usable_cores": h.cpu_usable, "logical_cores": h.cpu_logical, "physical_cores": h.cpu_physical,
                "gpus": gpus, "suggested_workers": workers}
    workers_text = f"{workers} DataLoader worker{'' if workers == 1 else 's'}"
    if gpus and h.cpu_usable / gpus < MIN_CORES_PER_GPU:
        return Finding("cpu_cores", "warn", "CPU cores",
                       f"{h.cpu_usable} usable cores{limited} for {gpus} GPU(s): data "
                       f"loading may starve the GPUs ({workers_text} per GPU)", evidence,
                       "Prepare the data once (`trainwise prepare`) so workers only read shards, keep augmentation "
                       "light, or ask for more cores (docker run --cpus=N).")
    per = " per GPU" if gpus else ""
    return Finding("cpu_cores", "info", "CPU cores",
                   f"{h.cpu_usable} usable cores{limited}: up to {workers_text}{per}", evidence)


def ram(h: HostFacts, gpu_memory_bytes: int) -> Finding:
    evidence = {"ram_total_bytes": h.ram_total_bytes, "ram_available_bytes": h.ram_available_bytes,
                "gpu_memory_total_bytes": gpu_memory_bytes}
    line = f"{h.ram_total_bytes / GIB:.0f} GiB RAM, {h.ram_available_bytes / GIB:.1f} GiB available"
    if h.ram_available_bytes < 2 * GIB:
        return Finding("ram", "warn", "RAM", f"{line}: DataLoader workers and checkpoint loading may be killed by the "
                       "OOM killer", evidence, "Stop other jobs (`ps aux --sort=-rss | head`) or use fewer workers.")
    if gpu_memory_bytes and h.ram_total_bytes < gpu_memory_bytes:
        return Finding("ram", "warn", "RAM", f"{line}, less than the {gpu_memory_bytes / GIB:.0f} GiB of GPU memory: "
                       "loading a checkpoint that fills the GPUs may swap", evidence,
                       "Load checkpoints straight to the GPU (map_location='cuda') and keep workers few.")
    return Finding("ram", "info", "RAM", line, evidence)


def open_files(h: HostFacts) -> Finding | None:
    if h.open_files_soft is None:
        return Finding("open_files", "info", "Open files", "no open-file limit", {})
    evidence = {"soft": h.open_files_soft, "hard": h.open_files_hard}
    if h.open_files_soft >= MIN_OPEN_FILES:
        return Finding("open_files", "info", "Open files", f"open-file limit {h.open_files_soft}", evidence)
    target = 65536 if h.open_files_hard is None else min(65536, h.open_files_hard)
    fix = f"ulimit -n {target}"
    if h.open_files_hard is not None and h.open_files_hard < 65536:
        fix += ("   # to raise the hard limit too: echo '* - nofile 65536' | sudo tee -a "
                "/etc/security/limits.conf, then log in again")
    return Finding("open_files", "warn", "Open files",
                   f"open-file limit {h.open_files_soft}: DataLoader workers can fail with "
                   "\"Too many open files\"", evidence, fix)


def shared_memory(h: HostFacts) -> Finding | None:
    if h.shm_total_bytes is None:
        return None
    size = size_text(h.shm_total_bytes)
    evidence = {"shm_total_bytes": h.shm_total_bytes, "shm_free_bytes": h.shm_free_bytes,
                "in_container": h.in_container}
    if h.shm_total_bytes >= MIN_SHM_BYTES:
        return Finding("shared_memory", "info", "Shared memory", f"/dev/shm is {size}", evidence)
    fix = ("Restart the container with a bigger /dev/shm: docker run --shm-size=16g ... (or --ipc=host)"
           if h.in_container else "sudo mount -o remount,size=16G /dev/shm")
    return Finding("shared_memory", "warn", "Shared memory",
                   f"/dev/shm is only {size}: DataLoader workers pass batches through it "
                   "and die with \"Bus error\" / \"No space left on device\"", evidence, fix)


def size_text(n: int) -> str:
    """Bytes as a person reads them: 1.5 GiB, 64 MB."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MB"
