"""Many GPUs through torchrun: one process per device, DistributedDataParallel, one writer.

`torchrun --nproc_per_node=N -m trainwise train RECIPE --out RUN` runs N ranks. `train.batch_size` stays the
global batch of one optimizer step; each rank feeds `micro_batch_size` samples per forward and accumulates
`batch_size / (micro_batch_size × N)` micro-batches. Only rank 0 writes the run directory.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainwise.run import RunDir


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_ranks() -> Ranks:
    """What torchrun's environment says, without starting anything."""
    return Ranks(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                 int(os.environ.get("LOCAL_RANK", 0)))


def init_distributed() -> Ranks:
    """Join the process group torchrun set up (NCCL on CUDA, Gloo on the CPU); a no-op for one process."""
    ranks = launched_ranks()
    if not ranks.enabled or dist.is_initialized():
        return ranks
    if torch.cuda.is_available():
        torch.cuda.set_device(ranks.local_rank)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return ranks


def agree(flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag true on every rank when it is true on one, in one small all-reduce: ranks must take every
    stop decision on the same step. Called at settle points only (log steps, evaluations, checkpoints)."""
    value = torch.tensor([float(flag) for flag in flags], device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return [v > 0 for v in value.tolist()]


def gather_objects(obj: Any) -> list[Any]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


class FollowerRunDir(RunDir):
    """The run directory as a rank other than 0 sees it: it reads what rank 0 wrote and writes nothing."""

    def initialise(self, *, overwrite: bool = False) -> "RunDir":
        return self

    def acquire_writer(self) -> "RunDir":
        return self  # rank 0 holds the run directory's lock; another rank on its host must not contend

    def write_error_log(self, text: str) -> None:
        pass

    def write_config(self, config) -> None:
        pass

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        pass

    def drop_metrics_after(self, step: int) -> None:
        pass

    def write_summary(self, summary: dict[str, Any]) -> None:
        pass

    def save_checkpoint(self, step: int, write, *, is_best: bool, keep_last: int) -> Path:
        return self.checkpoint_path(step)

    def write_model(self, state_dict, metadata=None) -> Path:
        return self.model_path
