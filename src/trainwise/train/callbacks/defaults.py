"""The callbacks every run has on its main rank, besides the caller's own."""
from __future__ import annotations

from typing import TYPE_CHECKING

from trainwise.config import RunConfig
from trainwise.train.callbacks.base import Callback
from trainwise.train.callbacks.live_diagnosis import LiveDiagnosis
from trainwise.train.callbacks.nonfinite_validation import NonFiniteValidation
from trainwise.train.loop.progress import ProgressDisplay, TensorBoardLog

if TYPE_CHECKING:
    from trainwise.diagnose.task_profile import TaskProfile


def default_callbacks(config: RunConfig, precision: str, profile: "TaskProfile | None") -> list[Callback]:
    """What every run has on its main rank: the progress display, live diagnosis, the non-finite validation
    check, TensorBoard when installed, telemetry when enabled. `precision`: what the run computes in; `profile`:
    the run's task profile (what chance is), which the live diagnosis judges by."""
    callbacks: list[Callback] = [ProgressDisplay(precision=precision), LiveDiagnosis(precision, profile),
                                 NonFiniteValidation()]
    if TensorBoardLog.available():
        callbacks.append(TensorBoardLog())
    if config.telemetry.enabled:
        from trainwise.train.callbacks.telemetry import TelemetryCallback  # lazy: no NVML import when off

        callbacks.append(TelemetryCallback(config.telemetry))
    return callbacks
