"""Telemetry while training: the engine's callback around the telemetry sampler.

    Trainer(..., callbacks=[TelemetryCallback(config.telemetry)])

writes system.jsonl (one sample every `telemetry.interval_s`, with the trainer's step) and alert events to
events.jsonl. The Trainer adds it itself when `telemetry.enabled`. It lives with the engine, whose hook
points it implements; telemetry (sampler, alert rules) stays a service that knows nothing of training.
"""
from __future__ import annotations

import threading
from typing import Any

from trainwise.config import TelemetryConfig
from trainwise.findings import EVENT_SEVERITY, Finding
from trainwise.telemetry.alerts import AlertRules
from trainwise.telemetry.sampler import Sampler
from trainwise.train.callbacks.base import Callback


class TelemetryCallback(Callback):
    """Starts the sampler when training starts, turns samples and the train log's data-wait share into
    alert events, stops the sampler when training ends (for any reason). Needs `trainer.run_dir`."""

    def __init__(self, settings: TelemetryConfig):
        self.settings = settings
        self.sampler: Sampler | None = None
        self._rules = AlertRules(settings)
        self._lock = threading.Lock()  # alert state is touched by the sampler thread and the training loop
        self._trainer = None

    def on_fit_start(self, trainer) -> None:
        if not self.settings.enabled or getattr(trainer, "run_dir", None) is None or self.sampler is not None:
            return
        self._trainer = trainer
        self.sampler = Sampler(self._record, self.settings.interval_s).start()
        if not self.sampler.has_gpus:
            trainer.run_dir.log_event("telemetry", "no NVIDIA GPU to monitor; recording host metrics only",
                                      step=getattr(trainer, "step", None),
                                      evidence={"nvml": self.sampler.nvml_error})

    def on_log(self, trainer, record: dict[str, Any]) -> None:
        wait = record.get("data_wait_fraction")
        if self.sampler is None or wait is None:
            return
        latest = self.sampler.latest or {}
        utilization = [g["utilization_pct"] for g in latest.get("gpus", []) if g.get("utilization_pct") is not None]
        with self._lock:
            alerts = self._rules.check_starvation(float(wait), utilization)
        self._log(alerts, record.get("step"))

    def on_fit_end(self, trainer, summary: dict[str, Any]) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None

    def _record(self, sample: dict[str, Any]) -> None:
        """Runs on the sampler thread."""
        step = getattr(self._trainer, "step", None)
        self._trainer.run_dir.log_system({"time": sample["time"], "step": step,
                                          **{k: v for k, v in sample.items() if k != "time"}})
        with self._lock:
            alerts = self._rules.check_sample(sample)
        self._log(alerts, step)

    def _log(self, alerts: list[Finding], step: int | None) -> None:
        for a in alerts:  # the finding's code is the event's kind; its fixes follow the title in the message
            message = " ".join([f"{a.title}.", *a.fixes])
            self._trainer.run_dir.log_event(a.code, message, severity=EVENT_SEVERITY[a.severity], step=step,
                                            evidence=a.evidence)
