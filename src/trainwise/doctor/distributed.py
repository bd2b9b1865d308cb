"""Is this machine ready for a job of N ranks? `trainwise doctor --nproc N`, and every doctor run inside a
launched job (torchrun or srun set WORLD_SIZE / LOCAL_RANK).

distributed_facts.py reads the launcher's environment, the NCCL/Gloo variables, the network interfaces and
/sys/class/infiniband into a `DistributedFacts`; `distributed_findings` decides from recorded facts alone:
visible GPUs against the ranks, the NCCL variables that commonly break or slow a job, InfiniBand, and
/dev/shm for every rank's DataLoader workers, each with its fix.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trainwise.data.loader import ASSUMED_BATCH_BYTES, PREFETCH_FACTOR, auto_workers
from trainwise.doctor.distributed_facts import DistributedFacts
from trainwise.doctor.host import size_text
from trainwise.findings import Finding

if TYPE_CHECKING:
    from trainwise.doctor.facts import Facts

GIB = 2**30
SHM_PER_WORKER_BYTES = PREFETCH_FACTOR * ASSUMED_BATCH_BYTES  # the batches a worker keeps ready wait in /dev/shm
TRUE = ("1", "true", "yes", "on")


# ---- decisions (pure) ----------------------------------------------------------------------------------
def distributed_findings(f: "Facts") -> list[Finding]:
    """Everything about running `f.distributed.nproc` ranks here, in the order to fix it."""
    d = f.distributed
    if d is None:
        return []
    gpus = f.torch.device_count
    uses_nccl = gpus > 0
    found = [ranks_and_gpus(f), *socket_interfaces(d, uses_nccl)]
    if uses_nccl:
        found += [peer_to_peer(d), infiniband(d), nccl_debug(d)]
    found.append(shared_memory_for_ranks(f))
    return [finding for finding in found if finding is not None]


def ranks_and_gpus(f: "Facts") -> Finding:
    d, gpus = f.distributed, f.torch.device_count
    present = max(len(f.nvml.gpus), f.host.nvidia_pci_devices)
    cvd = f.host.cuda_visible_devices
    evidence = {"nproc": d.nproc, "nnodes": d.nnodes, "torch_gpus": gpus, "gpus_on_machine": present,
                "CUDA_VISIBLE_DEVICES": cvd, "in_job": d.in_job, "rank": d.rank, "world_size": d.world_size}
    code, title = "ranks_and_gpus", "Ranks and GPUs"
    ranks = f"{d.nproc} rank{'s' if d.nproc != 1 else ''}"
    if gpus == 0 and present == 0:
        cores = f.host.cpu_usable
        if cores < d.nproc:
            return Finding(code, "warn", title, f"{ranks} on the CPU (gloo) but only {cores} usable cores: the ranks "
                           "time-share cores and every collective waits for the slowest", evidence,
                           f"Start at most {cores} ranks: --nproc {cores}")
        return Finding(code, "info", title, f"{ranks} on the CPU (gloo backend), {cores // d.nproc} usable "
                       "core(s) each", evidence)
    shown = f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else ""
    if gpus == 0:
        return Finding(code, "error", title, f"{ranks} asked for, but torch sees no GPU{shown}", evidence,
                       "Fix the GPU visibility finding above first, then run `trainwise doctor --nproc "
                       f"{d.nproc}` again.")
    if gpus < d.nproc:
        if d.in_job and gpus == 1 and cvd is not None:
            return Finding(code, "error", title, f"this rank sees 1 GPU{shown} but {ranks} run here and each "
                           "takes cuda:LOCAL_RANK: every rank but local rank 0 fails with \"invalid device "
                           "ordinal\"", evidence,
                           "Let every rank see all of the machine's GPUs: with SLURM use --gpus-per-node="
                           f"{d.nproc} (not --gpus-per-task) and --gpu-bind=none; elsewhere unset "
                           "CUDA_VISIBLE_DEVICES per task.")
        fix = f"Start {gpus} rank(s): --nproc {gpus}"
        if present >= d.nproc:
            fix += f"; or show {d.nproc} GPUs: export CUDA_VISIBLE_DEVICES={','.join(map(str, range(d.nproc)))}"
        else:
            fix += "; or give the container more GPUs (docker run --gpus all)"
        return Finding(code, "error", title, f"{ranks} but torch sees only {gpus} GPU(s){shown}: the extra ranks "
                       "fail with \"invalid device ordinal\"", evidence, fix)
    if gpus > d.nproc:
        return Finding(code, "info", title, f"{ranks} use {d.nproc} of the {gpus} visible GPUs", evidence,
                       f"To use them all: --nproc {gpus}")
    return Finding(code, "info", title, f"{ranks}, one per visible GPU{shown}", evidence)


def matching_interfaces(spec: str, interfaces: list[str]) -> list[str]:
    """The interfaces NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME select: a comma-separated list of name prefixes;
    `=` in front means exact names, `^` in front excludes the names that follow instead."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.removeprefix("^")
    exact = spec.startswith("=")
    names = [n.strip() for n in spec.removeprefix("=").split(",") if n.strip()]

    def named(interface: str) -> bool:
        return any(interface == n if exact else interface.startswith(n) for n in names)

    return [i for i in interfaces if named(i) != exclude]


def socket_interfaces(d: DistributedFacts, uses_nccl: bool) -> list[Finding]:
    """NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME naming an interface this machine does not have."""
    found = []
    for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if uses_nccl else ("GLOO_SOCKET_IFNAME",):
        spec = d.env.get(variable)
        if spec is None or not d.interfaces:
            continue
        # NCCL matches name prefixes; Gloo (PyTorch's GLOO_SOCKET_IFNAME) takes exact names only
        chosen = matching_interfaces(spec if variable.startswith("NCCL") else "=" + spec, d.interfaces)
        code = variable.lower()
        evidence = {variable: spec, "interfaces": d.interfaces, "selected": chosen}
        if chosen:
            found.append(Finding(code, "info", variable, f"{variable}={spec} selects {', '.join(chosen)}",
                                 evidence))
            continue
        usable = [i for i in d.interfaces if i != "lo" and not i.startswith(("docker", "veth"))] or d.interfaces
        what = "NCCL stops with \"Bootstrap : no socket interface found\"" if variable.startswith("NCCL") else \
            "Gloo cannot connect the ranks"
        found.append(Finding(code, "error", variable, f"{variable}={spec} matches no network interface here "
                             f"({', '.join(d.interfaces)}): {what}", evidence,
                             f"export {variable}={usable[0]}   # the interface the machines reach each other "
                             f"on; or unset {variable}"))
    return found


def peer_to_peer(d: DistributedFacts) -> Finding | None:
    value = d.env.get("NCCL_P2P_DISABLE")
    if value is None or value.strip().lower() not in TRUE or d.nproc < 2:
        return None
    return Finding("nccl_p2p_disabled", "warn", "NCCL peer-to-peer", f"NCCL_P2P_DISABLE={value}: the GPUs of this "
                   "machine exchange gradients through host memory instead of NVLink/PCIe peer-to-peer, so "
                   "every all-reduce is slower", {"NCCL_P2P_DISABLE": value, "nproc": d.nproc},
                   "unset NCCL_P2P_DISABLE   # keep it only where P2P hangs (some VMs; `nvidia-smi topo -m` shows "
                   "the links)")


def infiniband(d: DistributedFacts) -> Finding | None:
    """Only matters between machines: one machine's ranks talk over NVLink/PCIe."""
    if d.nnodes < 2:
        return None
    disabled = d.env.get("NCCL_IB_DISABLE", "").strip().lower() in TRUE
    devices = sorted({port.split("/")[0] for port in d.infiniband_ports})
    active = [port for port, state in d.infiniband_ports.items() if "ACTIVE" in state.upper()]
    evidence = {"infiniband_ports": d.infiniband_ports, "NCCL_IB_DISABLE": d.env.get("NCCL_IB_DISABLE"),
                "nnodes": d.nnodes}
    code, title = "infiniband", "InfiniBand"
    if not devices:
        return Finding(code, "info", title, f"no InfiniBand devices: NCCL talks between the {d.nnodes} machines "
                       "over TCP sockets (fine on fast Ethernet, slow on 10 GbE)", evidence)
    if disabled:
        return Finding(code, "warn", title, f"InfiniBand is here ({', '.join(devices)}) but NCCL_IB_DISABLE="
                       f"{d.env['NCCL_IB_DISABLE']}: traffic between machines goes over TCP sockets, many times "
                       "slower", evidence, "unset NCCL_IB_DISABLE")
    if not active:
        return Finding(code, "warn", title, f"InfiniBand devices ({', '.join(devices)}) but no port is ACTIVE: "
                       "NCCL falls back to sockets or fails to connect", evidence,
                       "ibstat   # check the cable and the subnet manager (opensm); or export NCCL_IB_DISABLE=1 "
                       "to use sockets knowingly")
    return Finding(code, "info", title, f"InfiniBand ports active: {', '.join(active)}", evidence)


def nccl_debug(d: DistributedFacts) -> Finding:
    nccl = {k: v for k, v in sorted(d.env.items()) if k.startswith("NCCL_")}
    others = ", ".join(f"{k}={v}" for k, v in nccl.items() if k != "NCCL_DEBUG") or "no other NCCL_* variables"
    evidence = {"nccl_env": nccl}
    level = nccl.get("NCCL_DEBUG")
    if level is None:
        return Finding("nccl_environment", "info", "NCCL environment", f"NCCL_DEBUG is not set ({others}): when a "
                       "job hangs or fails inside NCCL, it says nothing about why", evidence,
                       "export NCCL_DEBUG=WARN   # INFO for the full picture when debugging a hang")
    return Finding("nccl_environment", "info", "NCCL environment", f"NCCL_DEBUG={level} ({others})", evidence)


def shared_memory_for_ranks(f: "Facts") -> Finding | None:
    d, h = f.distributed, f.host
    if h.shm_free_bytes is None:
        return None
    automatic = d.num_workers is None
    workers = auto_workers(h.cpu_usable, d.nproc, ram_available_bytes=h.ram_available_bytes) if automatic \
        else d.num_workers
    need = d.nproc * workers * SHM_PER_WORKER_BYTES
    evidence = {"nproc": d.nproc, "workers_per_rank": workers, "workers_automatic": automatic,
                "bytes_per_worker": SHM_PER_WORKER_BYTES, "needed_bytes": need, "shm_free_bytes": h.shm_free_bytes,
                "shm_total_bytes": h.shm_total_bytes, "in_container": h.in_container}
    code, title = "shared_memory_for_ranks", "Shared memory for ranks"
    load = f"{d.nproc} rank(s) × {workers} DataLoader worker(s)"
    if workers == 0:
        return Finding(code, "info", title, f"{d.nproc} rank(s) without DataLoader workers: batches do not pass "
                       "through /dev/shm", evidence)
    if h.shm_free_bytes >= need:
        return Finding(code, "info", title, f"/dev/shm has {size_text(h.shm_free_bytes)} free for {load} "
                       f"(about {size_text(need)} of ready batches)", evidence)
    fits = h.shm_free_bytes // (d.nproc * SHM_PER_WORKER_BYTES)
    size = math.ceil(2 * need / GIB)  # headroom: batches bigger than assumed, pinned copies, a second job
    bigger = (f"Restart the container with --shm-size={size}g (or --ipc=host)" if h.in_container else
              f"sudo mount -o remount,size={size}G /dev/shm")
    return Finding(code, "warn", title, f"/dev/shm has {size_text(h.shm_free_bytes)} free, but {load} keep about "
                   f"{size_text(need)} of ready batches there: workers die with \"Bus error\"", evidence,
                   [bigger, f"or use fewer workers per rank: data.num_workers={fits}"])
