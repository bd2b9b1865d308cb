"""What a job of N ranks meets on this machine, read without judging it: the launcher's environment (torchrun
or srun set WORLD_SIZE / LOCAL_RANK), the NCCL/Gloo variables, the network interfaces and /sys/class/infiniband.
distributed.py decides from these facts alone."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

RECORDED_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES")
INFINIBAND = Path("/sys/class/infiniband")


@dataclass
class DistributedFacts:
    nproc: int
    """Ranks this machine starts: --nproc, or LOCAL_WORLD_SIZE (else WORLD_SIZE) inside a launched job."""
    nnodes: int = 1
    """Machines in the job: --nnodes, or WORLD_SIZE / LOCAL_WORLD_SIZE inside a launched job."""
    in_job: bool = False
    """True when the doctor itself runs as one rank of a launched job."""
    rank: int | None = None
    world_size: int | None = None
    num_workers: int | None = None
    """DataLoader workers per rank asked for (--num-workers); None: what `data.num_workers: auto` picks."""
    env: dict[str, str] = field(default_factory=dict)
    """Every NCCL_* variable set, and the launcher's (RECORDED_VARIABLES)."""
    interfaces: list[str] = field(default_factory=list)
    """Network interfaces of this machine (lo, eth0, ib0 ...)."""
    infiniband_ports: dict[str, str] = field(default_factory=dict)
    """/sys/class/infiniband: "mlx5_0/1" -> port state ("4: ACTIVE"); empty when there is no InfiniBand."""


def probe_distributed(nproc: int | None = None, nnodes: int | None = None,
                      num_workers: int | None = None) -> DistributedFacts | None:
    """The facts for a job of `nproc` ranks, or of the job this process is a rank of; None for neither."""
    env = os.environ
    in_job = "WORLD_SIZE" in env or "LOCAL_RANK" in env
    if nproc is None and not in_job:
        return None
    world, local_world = _int(env.get("WORLD_SIZE")), _int(env.get("LOCAL_WORLD_SIZE"))
    if nproc is None:
        nproc = local_world or world or 1
    if nnodes is None:
        nnodes = max(1, world // local_world) if in_job and world and local_world else 1
    return DistributedFacts(
        nproc=nproc, nnodes=nnodes, in_job=in_job, rank=_int(env.get("RANK")), world_size=world,
        num_workers=num_workers,
        env={k: v for k, v in env.items() if k.startswith("NCCL_") or k in RECORDED_VARIABLES},
        interfaces=_interfaces(), infiniband_ports=_infiniband_ports())


def with_job(recorded: DistributedFacts | None, nproc: int | None, nnodes: int | None,
             num_workers: int | None) -> DistributedFacts | None:
    """Recorded facts (`--facts FILE`) checked for the job asked for on the command line."""
    if nproc is None:
        return recorded
    if recorded is None:  # a record made without --nproc: no job environment to judge, only the machine
        return DistributedFacts(nproc=nproc, nnodes=nnodes or 1, num_workers=num_workers)
    return replace(recorded, nproc=nproc, nnodes=nnodes or recorded.nnodes,
                   num_workers=num_workers if num_workers is not None else recorded.num_workers)


def _interfaces() -> list[str]:
    import psutil

    try:
        return sorted(psutil.net_if_addrs())
    except OSError:
        return []


def _infiniband_ports() -> dict[str, str]:
    ports = {}
    for state in sorted(INFINIBAND.glob("*/ports/*/state")):
        try:
            ports[f"{state.parts[-4]}/{state.parts[-2]}"] = state.read_text().strip()
        except OSError:
            continue
    return ports


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None
