"""The callbacks every run has on its main rank, besides the caller's own."""
from __future__ import annotations

from trainwise.config import RunConfig
from trainwise.train.callbacks.base import Callback
from trainwise.train.callbacks.live_diagnosis import LiveDiagnosis
from trainwise.train.callbacks.nonfinite_validation import NonFiniteValidation
from trainwise.train.loop.progress import ProgressDisplay, TensorBoardLog


def default_callbacks(config: RunConfig) -> list[Callback]:
    """What every run has on its main rank: the progress display, live diagnosis, the non-finite validation
    check, TensorBoard when installed, telemetry when enabled."""
    callbacks: list[Callback] = [ProgressDisplay(), LiveDiagnosis(), NonFiniteValidation()]
    if TensorBoardLog.available():
        callbacks.append(TensorBoardLog())
    if config.telemetry.enabled:
        from trainwise.train.callbacks.telemetry import TelemetryCallback  # lazy: no NVML import when off

        callbacks.append(TelemetryCallback(config.telemetry))
    return callbacks
