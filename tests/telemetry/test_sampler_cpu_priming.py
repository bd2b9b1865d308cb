"""The first CPU reading is a real measurement, not the 0% of a just-primed psutil window."""
import threading
import time

from tests.doctor.fake_nvml import install_fake_nvml
from trainwise.telemetry.sampler import MIN_CPU_WINDOW_S, Sampler


class WindowedCpu:
    """psutil.cpu_percent(interval=None) as psutil computes it: 0.0 when no time passed since the previous
    call (the priming call, or a window shorter than a clock tick), otherwise the busy share."""

    def __init__(self):
        self.previous = None

    def __call__(self, interval=None):
        now, previous = time.monotonic(), self.previous
        self.previous = now
        return 0.0 if previous is None or now - previous < MIN_CPU_WINDOW_S / 2 else 37.5


def test_the_sampler_first_cpu_sample_is_measured_over_a_real_window(monkeypatch):
    import psutil

    install_fake_nvml(monkeypatch, [], init_error="Driver Not Loaded")
    monkeypatch.setattr(psutil, "cpu_percent", WindowedCpu())
    written, done = [], threading.Event()
    sampler = Sampler(lambda s: (written.append(s), done.set()), interval_s=0.05).start()
    assert done.wait(10)
    sampler.stop()
    assert written[0]["cpu_percent"] == 37.5
