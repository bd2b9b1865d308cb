"""Hook points of the training loop. Telemetry, diagnosis, progress display and evaluation attach here
instead of editing the loop.

Each method is called at one named moment with the trainer (read its `config`, `run_dir`, `device`, `model`,
`step`, `epoch`, `max_steps`) and the record just produced. A callback must not change the model or the
optimizer; it may call `trainer.request_stop(reason)`, and `trainer.evaluate_and_checkpoint()` (the loop's
evaluation point: validate, record, checkpoint) where the loop's cadence would not.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from trainwise.config import RunConfig
    from trainwise.train.trainer import Trainer


class Callback:
    def on_fit_start(self, trainer: "Trainer") -> None:
        """Before the first step (also after a resume); the run directory and config.yaml exist."""

    def on_step_end(self, trainer: "Trainer") -> None:
        """After every optimizer step. Keep it cheap: it is on the hot path."""

    def on_log(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        """Every `train.log_every` steps, with the train record written to metrics.jsonl: loss, lr,
        grad_norm, samples_per_s, step_time_s, data_wait_s, compute_s, data_wait_fraction, skipped_steps."""

    def on_eval(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        """After each validation pass, with its record (`split: val`, loss and metrics)."""

    def on_checkpoint(self, trainer: "Trainer", path: "Path") -> None:
        """After a checkpoint was written."""

    def on_fit_end(self, trainer: "Trainer", summary: dict[str, Any]) -> None:
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


def default_callbacks(config: "RunConfig") -> list[Callback]:
    """What every run has on its main rank: the progress display, live diagnosis, the non-finite validation
    check, TensorBoard when installed, telemetry when enabled."""
    from trainwise.train.live_diagnosis import LiveDiagnosis
    from trainwise.train.nonfinite_validation import NonFiniteValidation
    from trainwise.train.progress import ProgressDisplay, TensorBoardLog

    callbacks: list[Callback] = [ProgressDisplay(), LiveDiagnosis(), NonFiniteValidation()]
    if TensorBoardLog.available():
        callbacks.append(TensorBoardLog())
    if config.telemetry.enabled:
        from trainwise.train.telemetry_callback import TelemetryCallback  # lazy: no NVML import when off

        callbacks.append(TelemetryCallback(config.telemetry))
    return callbacks
