"""Checkpoints: everything needed to continue a run exactly where it was.

model, optimizer, scheduler, scaler, early-stopping state, the RNG states (python, numpy, torch, CUDA) and
the data position (epoch + batch). Written atomically by RunDir; read with `weights_only=True`, so loading a
checkpoint never unpickles arbitrary objects.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainwise.errors import RunDirError

if TYPE_CHECKING:
    from trainwise.train.trainer import Trainer

FORMAT_VERSION = 1


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


def checkpoint_writer(state: dict[str, Any]):
    """A `write(file)` callable for RunDir.save_checkpoint, which hashes the bytes as they are written and
    may call it a second time, into a counting sink, to say how much space a checkpoint needs."""
    payload = {"format_version": FORMAT_VERSION, **state}
    return lambda f: torch.save(payload, f)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint file. It is not verified here: choose it with RunDir.latest_intact_checkpoint()
    or check it with RunDir.verify(path) first (a few changed bytes still load, as wrong numbers)."""
    path = Path(path)
    if not path.is_file():
        raise RunDirError(f"no checkpoint at {path}. A run writes one after each evaluation, every "
                          "checkpoint.every_steps, and when it stops.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated file or a foreign pickle
        raise RunDirError(f"{path} cannot be read as a trainwise checkpoint ({type(e).__name__}: {e}).") from None
    if not isinstance(state, dict):
        raise RunDirError(f"{path} is not a trainwise checkpoint (it holds a {type(state).__name__}).")
    if state.get("format_version") != FORMAT_VERSION:
        raise RunDirError(f"{path} has checkpoint format {state.get('format_version')!r}; this trainwise reads "
                          f"format {FORMAT_VERSION}.")
    return state


def training_state(trainer: "Trainer") -> dict[str, Any]:
    """Everything a Trainer needs to continue exactly where it is (a collective under torchrun: the RNG
    states of every rank are gathered, so call it on all ranks)."""
    from trainwise.train.distributed import gather_objects

    return {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
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
    }


def restore_training_state(trainer: "Trainer", state: dict[str, Any]) -> None:
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
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
