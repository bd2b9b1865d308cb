"""Checkpoints: everything needed to continue a run exactly where it was.

model, optimizer, scheduler, scaler, early-stopping state, the RNG states (python, numpy, torch, CUDA) and
the data position (epoch + batch). The file format (and reading one back) is rundir/checkpoint_files.py's;
RunDir writes it atomically.

Two layouts, chosen by train.strategy: one file written by rank 0 (single, ddp: every rank holds the whole
model), or a sharded directory every rank writes its part of (fsdp, train/parallel/sharded_checkpoint.py). The
Checkpointer is built once from the parts it saves and chooses the layout in one place (`_sharded`); the
Trainer only calls `save`, `choose`, `load`, `restore_best` and `final_weights`.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainwise.config.diff import config_record
from trainwise.errors import DamagedFileError, RunDirError
from trainwise.rundir.checkpoint_files import checkpoint_writer, read_checkpoint, resume_checkpoint
from trainwise.rundir.integrity import CheckpointChoice
from trainwise.runtime.model_state import StateMismatch, check_same_base, kept_state, load_kept_state, save_record
from trainwise.train.step.schedule import continue_schedule

if TYPE_CHECKING:
    from trainwise.config import RunConfig
    from trainwise.rundir.layout import RunDir
    from trainwise.train.parallel.distributed import Ranks
    from trainwise.train.callbacks.early_stop import EarlyStopping
    from trainwise.train.step.state import TrainState


def checkpoint_bytes(model: torch.nn.Module, trainable: list[torch.nn.Parameter], optimizer_name: str) -> int:
    """About what one checkpoint takes on disk: weights (what trains, on a frozen base), buffers and the
    optimizer's moments."""
    weights = sum(t.nbytes for t in kept_state(model).values() if isinstance(t, torch.Tensor))
    moments = {"adamw": 2, "adam": 2, "sgd": 1}.get(optimizer_name, 2)
    return weights + moments * sum(p.nbytes for p in trainable)


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


class Checkpointer:
    """Everything a run needs to continue exactly where it is: the model, optimizer, scheduler, scaler, early
    stopping, the TrainState and every rank's RNG. Under torchrun each method is a collective: call it on
    every rank."""

    def __init__(self, run_dir: "RunDir", config: "RunConfig", *, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, scheduler: Any, scaler: torch.amp.GradScaler,
                 early_stopping: "EarlyStopping", state: "TrainState", ranks: "Ranks", sharded: bool):
        self.run_dir, self.config, self.model, self.optimizer = run_dir, config, model, optimizer
        self.scheduler, self.scaler, self.early_stopping = scheduler, scaler, early_stopping
        self.state, self.ranks = state, ranks
        self._sharded = sharded  # the one place file vs sharded storage is decided

    def size_bytes(self) -> int:
        """About what one checkpoint takes on disk (`checkpoint_bytes`), for the free-space check."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        return checkpoint_bytes(self.model, trainable, self.config.optim.name)

    def training_state(self, *, tensors: bool = True) -> dict[str, Any]:
        """The checkpoint's contents (the RNG states of every rank are gathered). Without `tensors`: all but
        the model and optimizer, which a sharded checkpoint stores apart."""
        from trainwise.train.parallel.distributed import gather_objects

        # a frozen base (LoRA, freeze) is rebuilt from its source on resume: only what trains is kept, with the
        # base's fingerprint (in a sharded checkpoint's state file too)
        weights = {"model": kept_state(self.model), "optimizer": self.optimizer.state_dict()} if tensors else {}
        state = self.state
        return {
            **weights,
            **save_record(self.model),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "early_stopping": self.early_stopping.state_dict(),
            "rng": capture_rng(),
            "rng_per_rank": gather_objects(capture_rng()) if self.ranks.enabled else [],
            "data_position": {"epoch": state.epoch, "batch": state.batch_in_epoch},
            "step": state.step,
            "epoch": state.epoch,
            "skipped_steps": state.skipped_steps,
            "micro_batch_size": state.micro_batch_size,  # an out-of-memory recovery's choice survives resume
            **config_record(self.config),  # `config` and `config_hash`: resume refuses another config.yaml
        }

    def restore(self, saved: dict[str, Any]) -> None:
        if "model" in saved:
            self._load_model(saved)
            self.optimizer.load_state_dict(saved["optimizer"])
        else:  # a sharded checkpoint's tensors are already loaded: was it on this base?
            self._check_base(saved)
        # the LR schedule's length comes from the config (a resume may change it): the rest of the decay is
        # re-fitted from the checkpoint's step, so the LR goes on from where it was (schedule.py)
        continue_schedule(self.scheduler, saved["scheduler"], int(saved["step"]))
        self.scaler.load_state_dict(saved["scaler"])
        self.early_stopping.load_state_dict(saved["early_stopping"])
        per_rank = saved.get("rng_per_rank") or []
        restore_rng(per_rank[self.ranks.rank] if len(per_rank) == self.ranks.world_size else saved["rng"])
        # an out-of-memory recovery's micro-batch comes back with the rest of the TrainState
        self.state.load_state_dict({"epoch": saved["data_position"]["epoch"],
                                    "batch_in_epoch": saved["data_position"]["batch"], "step": saved["step"],
                                    "skipped_steps": saved["skipped_steps"],
                                    "micro_batch_size": saved.get("micro_batch_size", self.state.micro_batch_size)})

    def save(self, *, is_best: bool) -> Path:
        """Checkpoint the current step."""
        if self._sharded:
            from trainwise.train.parallel import sharded_checkpoint

            write = checkpoint_writer(self.training_state(tensors=False))
            return sharded_checkpoint.save(self.run_dir, self.model, self.optimizer, self.ranks, self.state.step,
                                           write, is_best=is_best, keep_last=self.config.checkpoint.keep_last)
        return self.run_dir.save_checkpoint(self.state.step, checkpoint_writer(self.training_state()),
                                            is_best=is_best, keep_last=self.config.checkpoint.keep_last)

    def choose(self) -> CheckpointChoice:
        """The checkpoint a resume continues from (rundir's `resume_checkpoint`), the same on every rank."""
        if self._sharded:
            from trainwise.train.parallel import sharded_checkpoint

            return sharded_checkpoint.choose(self.run_dir, self.ranks)
        return resume_checkpoint(self.run_dir, sharded=False)

    def load(self, path: Path) -> None:
        """Continue from the checkpoint at `path`."""
        if self._sharded:
            from trainwise.train.parallel import sharded_checkpoint

            self.restore(sharded_checkpoint.load(self.run_dir, self.model, self.optimizer, path))
        else:
            self.restore(read_checkpoint(path))

    def restore_best(self) -> bool:
        """Put the best step's weights back when early stopping asks for it; whether it did."""
        es, best_step = self.config.eval.early_stopping, self.early_stopping.best_step
        if not (es.enabled and es.restore_best) or best_step is None or best_step == self.state.step:
            return False
        if self._sharded:  # every rank knows best_step (ranks evaluate alike); rotation keeps what `best` names
            from trainwise.train.parallel import sharded_checkpoint

            sharded_checkpoint.load_model(self.model, self.run_dir.checkpoint_dirs.path(best_step))
            return True
        best = self.run_dir.checkpoint_path("best")
        if not best.exists():
            return False
        try:
            self.run_dir.verify(best)
        except DamagedFileError as damage:  # keep the final weights rather than load damaged ones
            self.run_dir.log_event("best_damaged", str(damage), severity="warning", step=self.state.step)
            return False
        self._load_model(read_checkpoint(best))
        return True

    def final_weights(self) -> dict[str, torch.Tensor]:
        """The whole model's weights for model.safetensors (gathered to rank 0 when sharded)."""
        if self._sharded:
            from trainwise.train.parallel import sharded_checkpoint

            return sharded_checkpoint.full_model_state(self.model, sharded=torch.distributed.is_initialized())
        return kept_state(self.model)

    def write_final(self, *, weights_step: int | None, restored: bool) -> None:
        """model.safetensors (only what trains, on a frozen base) and, for a LoRA run, RUN/adapter/ in peft's
        format (rank 0)."""
        from trainwise.train.loop.adapters import save_adapter

        weights, record = self.final_weights(), save_record(self.model)  # collectives under FSDP
        self.run_dir.write_model(weights, {"step": str(weights_step), "run_steps": str(self.state.step),
                                           "restored_best": str(restored), **record})
        if self.ranks.is_main:
            save_adapter(self.model, self.run_dir, state=weights)

    def _load_model(self, saved: dict[str, Any]) -> None:
        try:
            load_kept_state(self.model, saved["model"], saved)
        except StateMismatch as mismatch:
            raise RunDirError(f"the checkpoint does not fit the model built from the run's config: {mismatch}") from None

    def _check_base(self, saved: dict[str, Any]) -> None:
        try:
            check_same_base(self.model, saved)
        except StateMismatch as mismatch:
            raise RunDirError(f"the checkpoint does not fit the model built from the run's config: {mismatch}") from None
