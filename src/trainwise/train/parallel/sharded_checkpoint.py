"""Sharded checkpoints (train.strategy=fsdp) with torch.distributed.checkpoint (DCP).

A checkpoint is a directory (RunDir.checkpoint_dirs): every rank writes its shards of the model and the
optimizer state there, in parallel, and rank 0 adds the small rest of the training state (scheduler, scaler,
early stopping, every rank's RNG, the data position, the run's config and its hash, which `resume` compares
with config.yaml: the Checkpointer's `training_state` without the tensors). The directory is written hidden, then renamed into place by rank 0 after all ranks are done, so
`last` always names a whole checkpoint.

A frozen base (LoRA, freeze) is not in the checkpoint: like a checkpoint file, it keeps what trains (and the
buffers), the training state records the base's fingerprint, and a resume rebuilds the base from its source.

DCP stores each tensor with its global shape and reshards on load: a checkpoint written by N ranks loads
into M ranks, or into one process and a plain, unsharded model. Every function here is a collective under
torchrun: call it on all ranks, on facts all ranks share. On several machines the run directory must be one
every rank reaches (a shared filesystem): the shards of one checkpoint are written from every host into it.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)

from trainwise.errors import RunDirError
from trainwise.runtime.model_state import kept_state
from trainwise.rundir.checkpoint_files import read_checkpoint
from trainwise.rundir.integrity import CheckpointChoice
from trainwise.train.parallel.distributed import barrier, broadcast_from_main

if TYPE_CHECKING:
    from trainwise.rundir.layout import RunDir
    from trainwise.train.parallel.distributed import Ranks


# what trains and the buffers, never the frozen base; loading fills exactly those (DCP refuses a checkpoint
# that lacks any of them), so the frozen parameters the load leaves alone are not an error
_KEPT = StateDictOptions(ignore_frozen_params=True)
_KEPT_LOAD = StateDictOptions(ignore_frozen_params=True, strict=False)


@contextmanager
def _one_process_is_intended() -> Iterator[None]:
    # fsdp in one process (a run resumed on fewer machines) uses DCP without a process group, on purpose
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save(run_dir: "RunDir", model: torch.nn.Module, optimizer: torch.optim.Optimizer, ranks: "Ranks", step: int,
         write_state: Callable[[Any], Any], *, is_best: bool, keep_last: int) -> Path:
    """Write the checkpoint of `step`: the shards from every rank, the rest (`write_state(file)`) from rank 0."""
    dirs = run_dir.checkpoint_dirs
    partial = dirs.begin(step)  # rank 0 clears a killed save's leftovers and makes the directory
    barrier(ranks)  # ... before any rank writes into it
    model_state, optimizer_state = get_state_dict(model, optimizer, options=_KEPT)
    with _one_process_is_intended():
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=partial)
    dirs.write_state(partial, write_state)
    path = dirs.commit(step, is_best=is_best, keep_last=keep_last)
    barrier(ranks)  # nobody goes on (or stops) before the checkpoint is committed
    return path


def load(run_dir: "RunDir", model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         directory: Path) -> dict[str, Any]:
    """Load the model and optimizer shards (resharded to this many ranks); return the rest of the training
    state for train/recovery/checkpoint.py's Checkpointer to restore."""
    # the current state dicts are the templates DCP fills: their shapes and shardings say what to read
    model_state, optimizer_state = get_state_dict(model, optimizer, options=_KEPT)
    loaded = {"model": model_state, "optimizer": optimizer_state}
    with _one_process_is_intended():
        dcp.load(loaded, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"],
                   options=_KEPT_LOAD)
    return read_checkpoint(run_dir.checkpoint_dirs.state_path(directory))


def load_model(model: torch.nn.Module, directory: Path) -> None:
    """Only the weights of a sharded checkpoint, into `model` (sharded or plain, any number of ranks)."""
    state = {"model": get_model_state_dict(model, options=_KEPT)}
    with _one_process_is_intended():
        dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state["model"], options=_KEPT_LOAD)


def full_model_state(model: torch.nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """The unsharded weights on rank 0 (gathered; the other ranks get {}), for model.safetensors: the whole
    model, or on a frozen base what trains and the buffers (as runtime/model_state.py's `kept_state`)."""
    if not sharded:
        return kept_state(model)
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                ignore_frozen_params=True))


def choose(run_dir: "RunDir", ranks: "Ranks") -> CheckpointChoice:
    """The same checkpoint on every rank: rank 0 chooses (rundir's resume_checkpoint), the others follow
    (a rank on another machine, or behind an NFS cache, could see another `last`)."""
    from trainwise.rundir.checkpoint_files import resume_checkpoint

    if not ranks.enabled:
        return resume_checkpoint(run_dir, sharded=True)
    choice: CheckpointChoice | RunDirError | None = None
    if ranks.is_main:
        try:
            choice = resume_checkpoint(run_dir, sharded=True)
        except RunDirError as error:  # every rank raises it, rather than the others waiting for a choice
            choice = error
    choice = broadcast_from_main(choice)
    if isinstance(choice, RunDirError):
        raise choice
    return choice
