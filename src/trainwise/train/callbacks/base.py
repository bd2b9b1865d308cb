"""Hook points of the training loop. Telemetry, diagnosis, progress display and evaluation attach here
instead of editing the loop.

Each method is called at one named moment with the trainer (read its `config`, `run_dir`, `device`, `model`,
`step`, `epoch`, `max_steps`) and the record just produced. A callback must not change the model or the
optimizer; it may call `trainer.request_stop(reason)`, and `trainer.evaluate_and_checkpoint()` (the loop's
evaluation point: validate, record, checkpoint) where the loop's cadence would not. `TrainerView` spells that
view: the Trainer is passed, and a callback written against the view needs nothing else of it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from torch import nn

    from trainwise.config import RunConfig
    from trainwise.rundir.layout import RunDir


class TrainerView(Protocol):
    """What a callback may read of the trainer it is given, and the two things it may ask of it."""

    config: RunConfig
    run_dir: RunDir
    device: torch.device
    model: nn.Module
    step: int
    epoch: int
    max_steps: int

    def request_stop(self, reason: str) -> None: ...

    def evaluate_and_checkpoint(self) -> None: ...


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
