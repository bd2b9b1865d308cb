"""The telemetry sampler: a background thread that reads NVML and psutil every N seconds and hands each
sample to a writer (RunDir.log_system while training, the screen in `trainwise monitor`), and
`TelemetryCallback`, which attaches it to the Trainer:

    Trainer(..., callbacks=[TelemetryCallback(config.telemetry)])

writes system.jsonl (one sample every `telemetry.interval_s`, with the trainer's step) and alert events to
events.jsonl. Without an NVIDIA GPU it records host metrics only.

It must never slow training: it sleeps between samples, runs at the lowest CPU priority, holds the GIL only
for the few Python lines of a reading (NVML calls are ctypes calls, which release it), and swallows its own
errors instead of raising into the trainer.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from trainwise.config import TelemetryConfig
from trainwise.telemetry.alerts import Alert, AlertRules
from trainwise.telemetry.nvml import NvmlSession, open_nvml
from trainwise.train.callbacks import Callback


class HostMeter:
    """Host CPU, RAM and disk-read rate; rates are since the previous reading."""

    def __init__(self):
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement window
        self._disk, self._disk_time = self._disk_read_bytes(), time.monotonic()

    def read(self) -> dict[str, Any]:
        memory = self._psutil.virtual_memory()
        now, disk = time.monotonic(), self._disk_read_bytes()
        rate = None
        if disk is not None and self._disk is not None and now > self._disk_time:
            rate = max(0.0, (disk - self._disk) / (now - self._disk_time))
        self._disk, self._disk_time = disk, now
        return {"cpu_percent": self._psutil.cpu_percent(interval=None), "ram_used_bytes": memory.used,
                "ram_total_bytes": memory.total, "ram_percent": memory.percent, "disk_read_bytes_per_s": rate}

    def _disk_read_bytes(self) -> int | None:
        try:
            counters = self._psutil.disk_io_counters()
        except (OSError, RuntimeError):
            return None
        return counters.read_bytes if counters is not None else None


def read_sample(nvml: NvmlSession | None, host: HostMeter) -> dict[str, Any]:
    """One telemetry sample: {"time", "gpus": [per-GPU fields], host fields}."""
    return {"time": time.time(), "gpus": nvml.samples() if nvml is not None else [], **host.read()}


class Sampler:
    """Samples every `interval_s` seconds on a daemon thread until `stop()`; the first sample is immediate."""

    def __init__(self, write: Callable[[dict[str, Any]], None], interval_s: float = 2.0):
        self.write = write
        self.interval_s = interval_s
        self.latest: dict[str, Any] | None = None
        self.nvml_error: str | None = None
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: NvmlSession | None = None

    @property
    def has_gpus(self) -> bool:
        return bool(self._nvml and self._nvml.handles)

    def start(self) -> "Sampler":
        self._nvml, self.nvml_error = open_nvml()
        self._host = HostMeter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="trainwise-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def _run(self) -> None:
        _lower_priority()
        while not self._stop.is_set():
            try:
                sample = read_sample(self._nvml, self._host)
                self.latest = sample
                self.write(sample)
            except Exception:  # a full disk or a vanished GPU must not take training down with it
                self.errors += 1
            self._stop.wait(self.interval_s)


def _lower_priority() -> None:
    try:  # on Linux a thread id names just this thread, so the trainer keeps its priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


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

    def _log(self, alerts: list[Alert], step: int | None) -> None:
        for a in alerts:
            self._trainer.run_dir.log_event(a.kind, a.message, severity=a.severity, step=step, evidence=a.evidence)
