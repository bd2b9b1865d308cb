"""TelemetryCallback on a stand-in trainer (config, run_dir, step): system.jsonl, alert events, clean stop."""
import threading
import time
from types import SimpleNamespace

import pytest

from tests.doctor.fake_nvml import FakeGpu, install_fake_nvml
from trainwise.config import RunConfig, TelemetryConfig
from trainwise.rundir.layout import RunDir
from trainwise.train.callbacks.telemetry import TelemetryCallback
from trainwise.train.callbacks.base import Callback


@pytest.fixture
def trainer(tmp_path):
    config = RunConfig()
    return SimpleNamespace(config=config, run_dir=RunDir.create(tmp_path / "run"), step=0)


def wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def fast(**kw):
    return TelemetryConfig(interval_s=0.05, **kw)


def telemetry_threads():
    return [t for t in threading.enumerate() if t.name == "trainwise-telemetry"]


def test_cpu_only_run_records_host_metrics_and_says_why(trainer, monkeypatch):
    install_fake_nvml(monkeypatch, [], init_error="NVML Shared Library Not Found")
    callback = TelemetryCallback(fast())
    assert isinstance(callback, Callback)
    callback.on_fit_start(trainer)
    trainer.step = 7
    assert wait_for(lambda: any(r["step"] == 7 for r in trainer.run_dir.read_system()))
    callback.on_fit_end(trainer, {"status": "completed"})
    samples = trainer.run_dir.read_system()
    assert samples[0]["gpus"] == [] and "cpu_percent" in samples[0] and "time" in samples[0]
    events = trainer.run_dir.read_events()
    assert [e["kind"] for e in events] == ["telemetry"] and "host metrics only" in events[0]["message"]
    assert not telemetry_threads()


def test_hot_throttling_gpu_raises_events_once(trainer, monkeypatch):
    card = FakeGpu(temperature=92, reasons=0x20 | 0x40, utilization=99)
    install_fake_nvml(monkeypatch, [card])
    callback = TelemetryCallback(fast())
    callback.on_fit_start(trainer)
    assert wait_for(lambda: len(trainer.run_dir.read_system()) >= 4)
    callback.on_fit_end(trainer, {})
    events = trainer.run_dir.read_events()
    kinds = sorted((e["kind"], e["severity"]) for e in events)
    assert kinds == [("gpu_temperature", "error"), ("gpu_throttle", "error")]  # once, not once per sample
    temperature = next(e for e in events if e["kind"] == "gpu_temperature")
    assert temperature["evidence"]["temperature_c"] == 92 and temperature["step"] == 0
    assert trainer.run_dir.read_system()[0]["gpus"][0]["temperature_c"] == 92


def test_data_starvation_from_the_train_log(trainer, monkeypatch):
    install_fake_nvml(monkeypatch, [FakeGpu(utilization=15)])
    callback = TelemetryCallback(fast())
    callback.on_fit_start(trainer)
    assert wait_for(lambda: callback.sampler.latest is not None)
    for step in (10, 20, 30):
        callback.on_log(trainer, {"split": "train", "step": step, "data_wait_fraction": 0.75})
    callback.on_fit_end(trainer, {})
    starved = [e for e in trainer.run_dir.read_events() if e["kind"] == "data_starvation"]
    assert len(starved) == 1 and starved[0]["step"] == 20 and starved[0]["severity"] == "warning"
    assert starved[0]["evidence"]["gpu_utilization_pct"] == [15]


def test_busy_gpu_is_not_starved(trainer, monkeypatch):
    install_fake_nvml(monkeypatch, [FakeGpu(utilization=98)])
    callback = TelemetryCallback(fast())
    callback.on_fit_start(trainer)
    assert wait_for(lambda: callback.sampler.latest is not None)
    for step in (10, 20, 30):
        callback.on_log(trainer, {"step": step, "data_wait_fraction": 0.5})
    callback.on_log(trainer, {"step": 40})  # a record without the field is ignored
    callback.on_fit_end(trainer, {})
    assert [e for e in trainer.run_dir.read_events() if e["kind"] == "data_starvation"] == []


def test_disabled_or_without_run_dir_does_nothing(trainer, monkeypatch):
    install_fake_nvml(monkeypatch, [FakeGpu()])
    off = TelemetryCallback(TelemetryConfig(enabled=False))
    off.on_fit_start(trainer)
    off.on_log(trainer, {"data_wait_fraction": 0.9})
    off.on_fit_end(trainer, {})
    nowhere = TelemetryCallback(fast())
    nowhere.on_fit_start(SimpleNamespace(config=trainer.config, run_dir=None, step=0))
    nowhere.on_fit_end(trainer, {})
    assert not trainer.run_dir.system_path.exists() and not trainer.run_dir.events_path.exists()
    assert not telemetry_threads()
