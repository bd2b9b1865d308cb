"""Many GPUs through torchrun: one process per device, DDP or FSDP2 (`train.strategy`), one writer.

`torchrun --nproc_per_node=N -m trainwise train RECIPE --out RUN` runs N ranks. `train.batch_size` stays the
global batch of one optimizer step; each rank feeds `micro_batch_size` samples per forward (unset: its share,
`batch_size / N`) and accumulates `batch_size / (micro_batch_size × N)` micro-batches. Only rank 0 writes the
run directory and prints the outcome.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainwise.errors import ConfigError, TrainingError
from trainwise.rundir.layout import RunDir
from trainwise.rundir.checkpoint_dirs import CheckpointDirs
from trainwise.train.step.train_step import training_module

Strategy = Literal["single", "ddp", "fsdp"]


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


def resume_command(run_path: Path | str) -> str:
    """How to continue a run at the terminal: `trainwise resume RUN` with the launch this process is part of
    (`--nproc N` per node, and the nodes), so a stopped job does not come back as one process without a word."""
    command = f"trainwise resume {run_path}"
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 0))
    if "TORCHELASTIC_RUN_ID" not in os.environ or per_node < 1:
        return command
    command += f" --nproc {per_node}"
    nodes = launched_ranks().world_size // per_node
    if nodes > 1:  # the endpoint is the user's (torchrun does not pass it on): named, as `train` takes it
        command += f" --nnodes {nodes} --node-rank I --rdzv-endpoint HOST:PORT (on each node I)"
    return command


def init_distributed(timeout_s: float = 600.0, *, sharded: bool = False) -> Ranks:
    """Join the process group torchrun set up (NCCL on CUDA, Gloo on the CPU); a no-op for one process, unless
    torchrun started it for an explicit ddp or fsdp run (`sharded`): DDP or FSDP over one rank is the 1-GPU
    smoke of the real path.
    A collective that waits `timeout_s` for a dead or stuck rank raises instead of hanging the job."""
    ranks = launched_ranks()
    one_under_torchrun = sharded and "TORCHELASTIC_RUN_ID" in os.environ
    if not (ranks.enabled or one_under_torchrun) or dist.is_initialized():
        return ranks
    if torch.cuda.is_available():
        torch.cuda.set_device(ranks.local_rank)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timedelta(seconds=timeout_s))
    return ranks


@contextmanager
def leaving_the_job() -> Iterator[None]:
    """Around everything a rank does in the job: a run that ended (completed, or stopped on the same step
    everywhere) leaves the process group after its last collective, once every rank got there (rank 0's final
    writes included), so no rank tears the group down under a peer still in one. Left to the interpreter's
    exit, Gloo's worker threads still held finished work whose tensors reference Python objects, freed while
    Python was torn down: SIGABRT ("terminate called without an active exception") after a completed run, and
    the job failed. A failing rank leaves the group as it is: its peers may be gone or mid-collective, where a
    shutdown (NCCL's abort above all) can hang instead of exiting."""
    yield
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def resolve_strategy(requested: str, ranks: Ranks) -> Strategy:
    """What `train.strategy` means for this many ranks. The engine resolves `auto` by the process count only;
    choosing fsdp from memory estimates is the planner's call, made before the ranks start. fsdp in one process
    (not under torchrun) trains unsharded but keeps the sharded checkpoint format: a run started on N ranks
    resumes in one process, and loads into a plain model."""
    if requested == "auto":
        return "ddp" if ranks.enabled else "single"
    if requested == "single" and ranks.enabled:
        raise ConfigError(f"train.strategy=single, but torchrun started {ranks.world_size} ranks. Use "
                          "train.strategy=ddp or fsdp (or auto), or run one process without torchrun.")
    if requested == "ddp" and not ranks.enabled and not dist.is_initialized():  # one rank under torchrun: a smoke
        raise ConfigError("train.strategy=ddp needs several processes, but this is one. Launch it with "
                          "`torchrun --nproc_per_node=N -m trainwise train ...`, or set train.strategy=single "
                          "(or auto).")
    return requested  # type: ignore[return-value]


def wrap_model(model: nn.Module, strategy: Strategy, *, device: torch.device, precision: str, cpu_offload: bool,
               loss_chunk: int | None = None) -> tuple[Callable[..., torch.Tensor], Callable[[], Any] | None]:
    """(what computes the outputs, the context that skips the gradient all-reduce/reduce-scatter on
    micro-batches before the last). FSDP shards `model` in place: its parameters become DTensors.
    `loss_chunk` (model.loss_chunk_size): what computes is the model's TokenLossModel, whose forward returns the
    chunked loss through the model's own forward, so DDP reduces the head's gradients and FSDP gathers its
    weights (train/step/train_step.py); FSDP's root stays the model, which evaluation and checkpoints use."""
    if strategy in ("ddp", "fsdp") and any(isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse
                                           for m in model.modules()):
        raise ConfigError(f"sparse embedding gradients (model.args.sparse_embeddings=true) cannot be averaged "
                          f"across ranks under train.strategy={strategy} (NCCL has no sparse all-reduce): train "
                          "on one rank, or set model.args.sparse_embeddings=false.")
    if strategy == "ddp":
        ddp = DistributedDataParallel(training_module(model, loss_chunk))
        return ddp, ddp.no_sync
    if strategy == "fsdp" and dist.is_initialized():
        from trainwise.train.parallel.fsdp import gradient_sync_off, shard_model

        shard_model(model, precision=precision, cpu_offload=cpu_offload, device=device)
        return training_module(model, loss_chunk), lambda: gradient_sync_off(model)
    return training_module(model, loss_chunk), None


# what Gloo and NCCL say when the rank at the other end of a collective is gone (they raise plain
# RuntimeErrors, and under FSDP from inside the model's forward, where they look like the model's fault)
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "third_party/gloo", "NCCL", "ProcessGroup")


def peer_lost(error: BaseException, ranks: Ranks, step: int) -> TrainingError | None:
    """A TrainingError naming the lost rank when `error` is a collective failing because a peer died or hung;
    None for any other error (a one-process run's included)."""
    if not ranks.enabled:
        return None
    cause: BaseException | None = error
    while cause is not None and not (isinstance(cause, dist.DistError) or isinstance(cause, RuntimeError)
                                     and any(mark in str(cause) for mark in _PEER_GONE)):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    # with two ranks the one at the other end is known; with more, torchrun's summary names it
    peer = f"rank {1 - ranks.rank}" if ranks.world_size == 2 else "another rank"
    return TrainingError(f"{peer} of this {ranks.world_size}-rank job stopped answering during step {step} (it died "
                         f"or hangs; torchrun's failure summary names it and its exit code), so rank {ranks.rank} "
                         f"stops too. The last checkpoint is intact; fix the cause, then `trainwise resume`. "
                         f"({type(cause).__name__}: {str(cause)[:200]})")


def broadcast_from_main(obj: Any) -> Any:
    """Rank 0's `obj` on every rank: a decision taken from what rank 0 sees, made everyone's."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ranks: Ranks) -> None:
    if ranks.enabled:
        dist.barrier()


def agree(flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag true on every rank when it is true on one, in one small all-reduce: ranks must take every
    stop decision on the same step. Called at settle points only (log steps, evaluations, checkpoints), and
    once per guarded step (train/recovery/oom.py: did any rank run out of memory?)."""
    value = torch.tensor([float(flag) for flag in flags], device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return [v > 0 for v in value.tolist()]


# DDP's own default bucket size (bucket_cap_mb=25): big enough to amortise a collective's latency, small
# enough that the flattened copy costs little memory next to the gradients themselves
GRADIENT_BUCKET_BYTES = 25 * 2**20


def average_gradients(parameters: list[nn.Parameter]) -> None:
    """What DDP's reducer does in backward, done after it: every rank's accumulated gradients replaced by their
    mean over the ranks, a few collectives for the whole model (one per ~25 MiB bucket of one dtype)."""
    open_buckets: dict[tuple[torch.dtype, torch.device], tuple[list[torch.Tensor], int]] = {}
    buckets: list[list[torch.Tensor]] = []
    for grad in (p.grad for p in parameters if p.grad is not None):
        bucket, size = open_buckets.get((grad.dtype, grad.device), ([], 0))
        if not bucket or size + grad.nbytes > GRADIENT_BUCKET_BYTES:
            bucket, size = [], 0
            buckets.append(bucket)
        bucket.append(grad)
        open_buckets[(grad.dtype, grad.device)] = (bucket, size + grad.nbytes)
    world_size = dist.get_world_size()
    for bucket in buckets:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        flat.div_(world_size)  # before the sum, as DDP does: the same numbers as its update, no fp16 overflow
        dist.all_reduce(flat)
        offset = 0
        for grad in bucket:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def reduce_log_record(record: dict[str, float], device: torch.device) -> dict[str, float]:
    """A log line for the whole job (at log steps only): the loss averaged over every rank's samples, the
    data wait of the rank that waited longest (the others wait for it in the next collective)."""
    on = device if device.type == "cuda" else "cpu"
    loss = torch.tensor([record["loss"]], dtype=torch.float64, device=on)
    wait = torch.tensor([record["data_wait_s"], record["data_wait_fraction"]], dtype=torch.float64, device=on)
    dist.all_reduce(loss)
    dist.all_reduce(wait, op=dist.ReduceOp.MAX)
    data_wait_s, data_wait_fraction = wait.tolist()
    return {**record, "loss": loss.item() / dist.get_world_size(), "data_wait_s": data_wait_s,
            "data_wait_fraction": data_wait_fraction}


def gather_objects(obj: Any) -> list[Any]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


class FollowerRunDir(RunDir):
    """The run directory as a rank other than 0 sees it: it reads what rank 0 wrote and writes nothing."""

    def initialise(self, *, overwrite: bool = False, inputs=()) -> "RunDir":
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

    @property
    def checkpoint_dirs(self) -> CheckpointDirs:
        return super().checkpoint_dirs.read_only()  # every rank writes its shards; rank 0 commits them
