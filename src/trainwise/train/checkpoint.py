"""Checkpoints: everything needed to continue a run exactly where it was.

model, optimizer, scheduler, scaler, early-stopping state, the RNG states (python, numpy, torch, CUDA) and
the data position (epoch + batch). The file format (and reading one back) is rundir/checkpoint_files.py's;
RunDir writes it atomically.

Two layouts, chosen by train.strategy: one file written by rank 0 (single, ddp: every rank holds the whole
model), or a sharded directory every rank writes its part of (fsdp, train/sharded_checkpoint.py). `save`,
`choose`, `load`, `restore_best` and `final_weights` pick the layout; the Trainer only calls them.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainwise.config.diff import config_record
from trainwise.errors import DamagedFileError
from trainwise.rundir.checkpoint_files import checkpoint_writer, read_checkpoint, read_checkpoint_header  # noqa: F401
from trainwise.rundir.integrity import CheckpointChoice

if TYPE_CHECKING:
    from trainwise.rundir.layout import RunDir
    from trainwise.train.trainer import Trainer


def capture_rng() -> dict[str, Any]:
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["position"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def training_state(trainer: "Trainer", *, tensors: bool = True) -> dict[str, Any]:
    """Everything a Trainer needs to continue exactly where it is (a collective under torchrun: the RNG
    states of every rank are gathered, so call it on all ranks). Without `tensors`: all but the model and
    optimizer, which a sharded checkpoint stores apart."""
    from trainwise.train.distributed import gather_objects

    weights = {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()} if tensors else {}
    return {
        **weights,
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "early_stopping": trainer.early_stopping.state_dict(),
        "rng": capture_rng(),
        "rng_per_rank": gather_objects(capture_rng()) if trainer.ranks.enabled else [],
        "data_position": {"epoch": trainer.epoch, "batch": trainer.batch_in_epoch},
        "step": trainer.step,
        "epoch": trainer.epoch,
        "skipped_steps": trainer.skipped_steps,
        "micro_batch_size": trainer.micro_batch_size,  # an out-of-memory recovery's choice survives resume
        **config_record(trainer.config),  # `config` and `config_hash`: resume refuses another config.yaml
    }


def restore_training_state(trainer: "Trainer", state: dict[str, Any]) -> None:
    if "model" in state:  # a sharded checkpoint's tensors are already loaded
        trainer.model.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
    # the LR schedule's shape comes from the config (a resume may lengthen the run), not from the checkpoint
    scheduler = state["scheduler"]
    trainer.scheduler.load_state_dict({**scheduler, "lr_lambdas": [None] * len(scheduler.get("lr_lambdas", []))})
    trainer.scaler.load_state_dict(state["scaler"])
    trainer.early_stopping.load_state_dict(state["early_stopping"])
    per_rank = state.get("rng_per_rank") or []
    restore_rng(per_rank[trainer.ranks.rank] if len(per_rank) == trainer.ranks.world_size else state["rng"])
    trainer.epoch = state["data_position"]["epoch"]
    trainer.batch_in_epoch = state["data_position"]["batch"]
    trainer.step = state["step"]
    trainer.skipped_steps = state["skipped_steps"]
    if state.get("micro_batch_size", trainer.micro_batch_size) != trainer.micro_batch_size:
        trainer.set_micro_batch(state["micro_batch_size"])


# ---- the layout a strategy keeps: the Trainer's only entry points ------------------------------------------
def save(trainer: "Trainer", *, is_best: bool) -> Path:
    """Checkpoint the trainer's current step; a collective under torchrun (call it on every rank)."""
    if trainer.sharded:
        from trainwise.train import sharded_checkpoint

        state = training_state(trainer, tensors=False)
        return sharded_checkpoint.save(trainer, checkpoint_writer(state), is_best=is_best)
    return trainer.run_dir.save_checkpoint(trainer.step, checkpoint_writer(training_state(trainer)), is_best=is_best,
                                           keep_last=trainer.config.checkpoint.keep_last)


def latest_checkpoint(run_dir: "RunDir", sharded: bool) -> CheckpointChoice:
    """The checkpoint a resume continues from; RunDirError when there is none to trust."""
    if sharded:
        from trainwise.train import sharded_checkpoint

        return sharded_checkpoint.latest(run_dir)
    return run_dir.latest_intact_checkpoint()  # `last`, or the newest step whose checksum verifies


def choose(trainer: "Trainer") -> CheckpointChoice:
    """`latest_checkpoint`, the same on every rank."""
    if trainer.sharded:
        from trainwise.train import sharded_checkpoint

        return sharded_checkpoint.choose(trainer)
    return latest_checkpoint(trainer.run_dir, sharded=False)


def load(trainer: "Trainer", path: Path) -> None:
    """Continue from the checkpoint at `path` (a collective for sharded checkpoints)."""
    if trainer.sharded:
        from trainwise.train import sharded_checkpoint

        restore_training_state(trainer, sharded_checkpoint.load(trainer, path))
    else:
        restore_training_state(trainer, read_checkpoint(path))


def restore_best(trainer: "Trainer") -> bool:
    """Put the best step's weights back when early stopping asks for it; whether it did."""
    es, best_step = trainer.config.eval.early_stopping, trainer.early_stopping.best_step
    if not (es.enabled and es.restore_best) or best_step is None or best_step == trainer.step:
        return False
    if trainer.sharded:  # every rank knows best_step (ranks evaluate alike); rotation keeps what `best` names
        from trainwise.train import sharded_checkpoint

        sharded_checkpoint.load_model(trainer.model, trainer.run_dir.checkpoint_dirs.path(best_step))
        return True
    best = trainer.run_dir.checkpoint_path("best")
    if not best.exists():
        return False
    try:
        trainer.run_dir.verify(best)
    except DamagedFileError as damage:  # keep the final weights rather than load damaged ones
        trainer.run_dir.log_event("best_damaged", str(damage), severity="warning", step=trainer.step)
        return False
    trainer.model.load_state_dict(read_checkpoint(best)["model"])
    return True


def final_weights(trainer: "Trainer") -> dict[str, torch.Tensor]:
    """The whole model's weights for model.safetensors (gathered to rank 0 when sharded; a collective)."""
    if trainer.sharded:
        from trainwise.train import sharded_checkpoint

        return sharded_checkpoint.full_model_state(trainer.model, sharded=torch.distributed.is_initialized())
    return trainer.model.state_dict()
