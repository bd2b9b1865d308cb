"""The telemetry sampler: a background thread that reads NVML and psutil every N seconds and hands each
sample to a writer (RunDir.log_system while training, the screen in `trainwise monitor`). Without an NVIDIA
GPU it records host metrics only. The training engine attaches it through its own callback
(trainwise.train.callbacks.telemetry); telemetry knows nothing of the engine.

It must never slow training: it sleeps between samples, runs at the lowest CPU priority, holds the GIL only
for the few Python lines of a reading (NVML calls are ctypes calls, which release it), and swallows its own
errors instead of raising into the trainer.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from trainwise.telemetry.nvml import NvmlSession, open_nvml

MIN_CPU_WINDOW_S = 0.1  # psutil counts CPU time in 10 ms ticks: a shorter window reads as 0% or 100%


class HostMeter:
    """Host CPU, RAM and disk-read rate; rates are since the previous reading. The first reading must come
    at least MIN_CPU_WINDOW_S after construction, or its CPU share covers no time and says 0%."""

    def __init__(self):
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement window
        self._process = psutil.Process()
        self._disk, self._disk_time = self._disk_read_bytes(), time.monotonic()

    def read(self) -> dict[str, Any]:
        memory = self._psutil.virtual_memory()
        now, disk = time.monotonic(), self._disk_read_bytes()
        rate = None
        if disk is not None and self._disk is not None and now > self._disk_time:
            rate = max(0.0, (disk - self._disk) / (now - self._disk_time))
        self._disk, self._disk_time = disk, now
        return {"cpu_percent": self._psutil.cpu_percent(interval=None), "ram_used_bytes": memory.used,
                "ram_total_bytes": memory.total, "ram_percent": memory.percent, "disk_read_bytes_per_s": rate,
                "rss_bytes": self._process.memory_info().rss}  # this process: what a leak grows

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
    """Samples every `interval_s` seconds on a daemon thread until `stop()`; the first sample comes after
    MIN_CPU_WINDOW_S, so its CPU share is measured over a real window (psutil's first call only primes)."""

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
        self._stop.wait(MIN_CPU_WINDOW_S)
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
