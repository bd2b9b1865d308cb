"""A tiny all-reduce across the GPUs, in a child process with a deadline: a broken NCCL/P2P setup hangs
instead of failing, and doctor must come back either way.

    python -m trainwise.doctor.smoke --world-size 2 --backend nccl
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta


@dataclass
class AllReduceFacts:
    """One all-reduce over `world_size` local processes: whether it finished, in how long, or what went wrong."""

    backend: str
    world_size: int
    ok: bool
    seconds: float | None = None
    error: str | None = None


def run_all_reduce(world_size: int, backend: str = "nccl", *, timeout_s: float = 60.0) -> AllReduceFacts:
    """Launch the smoke test and report what happened; never raises."""
    command = [sys.executable, "-m", "trainwise.doctor.smoke", "--world-size", str(world_size),
               "--backend", backend]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return AllReduceFacts(backend, world_size, ok=False, seconds=timeout_s,
                              error=f"no answer within {timeout_s:.0f} s (the all-reduce hung)")
    seconds = round(time.perf_counter() - started, 3)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        result = json.loads(lines[-1])
        return AllReduceFacts(backend, world_size, ok=result["ok"], seconds=seconds, error=result.get("error"))
    tail = (done.stderr.strip().splitlines() or ["exit code %d" % done.returncode])[-1]
    return AllReduceFacts(backend, world_size, ok=False, seconds=seconds, error=tail[:500])


def _worker(rank: int, world_size: int, backend: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=30))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    value = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(value)
    expected = world_size * (world_size + 1) / 2
    ok = bool(torch.all(value == expected).item())
    if rank == 0:
        error = None if ok else f"all-reduce gave {value[0].item()}, expected {expected}"
        print(json.dumps({"ok": ok, "error": error}), flush=True)
    dist.barrier()  # no rank tears the group down under a peer still in it (Gloo aborts: train/parallel/distributed.py)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    args = parser.parse_args()
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(args.world_size, args.backend, _free_port()), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
