"""Hook points of the training loop. Telemetry, diagnosis, progress display and evaluation attach here
instead of editing the loop.

Each method is called at one named moment with a `TrainerView` (its `config`, `run_dir`, `device`, `model`,
`state`, `step`, `epoch`, `max_steps`, and `metrics`: the newest train and validation records) and the record
just produced. It is not the Trainer: the optimizer, the step, the loader stay the engine's own. A callback must
not change the model; it may call `view.request_stop(reason)`, and `view.evaluate_and_checkpoint()` (the loop's
evaluation point: validate, record, checkpoint) where the loop's cadence would not. A callback that needs more
of the run is given it when it is made (train/loop/builder.py makes the engine's own).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from torch import nn

    from trainwise.config import RunConfig
    from trainwise.rundir.layout import RunDir
    from trainwise.train.step.state import TrainState


@dataclass(frozen=True, slots=True, eq=False)
class TrainerView:
    """What a callback may read of the run it is called from, and the two things it may ask of it."""

    config: RunConfig
    run_dir: RunDir
    device: torch.device
    model: nn.Module
    state: TrainState
    """Where the run is (step, epoch, position in the epoch, micro-batch); read it, never set it."""
    max_steps: int
    metrics: Mapping[str, Mapping[str, Any]]
    """The newest record of each split logged so far ("train", "val"), as metrics.jsonl has them."""
    request_stop: Callable[[str], None]
    """Stop after the current optimizer step, with this reason."""
    evaluate_and_checkpoint: Callable[[], None]
    """The loop's evaluation point now: validate, record, update early stopping, checkpoint."""

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def epoch(self) -> int:
        return self.state.epoch


class Callback:
    def on_fit_start(self, trainer: "TrainerView") -> None:
        """Before the first step (also after a resume); the run directory and config.yaml exist."""

    def on_step_end(self, trainer: "TrainerView") -> None:
        """After every optimizer step. Keep it cheap: it is on the hot path."""

    def on_log(self, trainer: "TrainerView", record: dict[str, Any]) -> None:
        """Every `train.log_every` steps, with the train record written to metrics.jsonl: loss, lr,
        grad_norm, samples_per_s, step_time_s, data_wait_s, compute_s, data_wait_fraction, skipped_steps."""

    def on_eval(self, trainer: "TrainerView", record: dict[str, Any]) -> None:
        """After each validation pass, with its record (`split: val`, loss and metrics)."""

    def on_checkpoint(self, trainer: "TrainerView", path: "Path") -> None:
        """After a checkpoint was written."""

    def on_fit_end(self, trainer: "TrainerView", summary: dict[str, Any]) -> None:
        """After training ends for any reason (completed, stopped, failed); summary.json is written."""


class CallbackList(Callback):
    """Calls each callback in order."""

    def __init__(self, callbacks: list[Callback]):
        self.callbacks = list(callbacks)

    def on_fit_start(self, trainer):
        for c in self.callbacks:
            c.on_fit_start(trainer)

    def on_step_end(self, trainer):
        for c in self.callbacks:
            c.on_step_end(trainer)

    def on_log(self, trainer, record):
        for c in self.callbacks:
            c.on_log(trainer, record)

    def on_eval(self, trainer, record):
        for c in self.callbacks:
            c.on_eval(trainer, record)

    def on_checkpoint(self, trainer, path):
        for c in self.callbacks:
            c.on_checkpoint(trainer, path)

    def on_fit_end(self, trainer, summary):
        for c in self.callbacks:
            c.on_fit_end(trainer, summary)
