"""GPU and host telemetry: the sampler behind system.jsonl, its alerts, and `trainwise monitor`."""
from __future__ import annotations


def __getattr__(name: str):
    # lazy, so `import trainwise.telemetry.nvml` (doctor) does not pull in the training package
    if name == "TelemetryCallback":
        from trainwise.telemetry.sampler import TelemetryCallback

        return TelemetryCallback
    raise AttributeError(name)


__all__ = ["TelemetryCallback"]
