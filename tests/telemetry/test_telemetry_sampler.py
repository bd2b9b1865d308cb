"""The sampler thread: host metrics without a GPU, GPU fields through a fake NVML, prompt stop, no raising."""
import threading
import time

from tests.doctor.fake_nvml import FakeGpu, install_fake_nvml
from trainwise.telemetry.nvml import open_nvml, throttle_reason_names
from trainwise.telemetry.sampler import HostMeter, Sampler, read_sample

HOST_FIELDS = {"cpu_percent", "ram_used_bytes", "ram_total_bytes", "ram_percent", "disk_read_bytes_per_s"}
GPU_FIELDS = {"index", "name", "utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_c",
              "power_w", "power_limit_w", "sm_clock_mhz", "fan_pct", "throttle_reasons"}


def wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_host_sample_without_gpu(monkeypatch):
    install_fake_nvml(monkeypatch, [], init_error="NVML Shared Library Not Found")
    nvml, error = open_nvml()
    assert nvml is None and "Library Not Found" in error
    s = read_sample(None, HostMeter())
    assert s["gpus"] == [] and HOST_FIELDS <= set(s)
    assert 0 <= s["cpu_percent"] <= 100 and 0 < s["ram_used_bytes"] < s["ram_total_bytes"]


def test_sampler_writes_at_its_interval_and_stops_promptly(monkeypatch):
    install_fake_nvml(monkeypatch, [], init_error="Driver Not Loaded")
    written = []
    sampler = Sampler(written.append, interval_s=0.05).start()
    assert wait_for(lambda: len(written) >= 3)
    sampler.interval_s = 3600.0  # the next wait is an hour long: only a stop that wakes it ends the thread
    assert wait_for(lambda: len(written) >= 4)  # that write is followed by the hour-long wait
    sampler.stop()  # joins for at most its 5 s: a thread still alive below means the wait was slept out
    count = len(written)
    time.sleep(0.15)
    assert len(written) == count  # nothing after stop
    assert not any(t.name == "trainwise-telemetry" for t in threading.enumerate())
    assert not sampler.has_gpus and "Driver Not Loaded" in sampler.nvml_error


def test_gpu_fields_through_nvml(monkeypatch):
    card = FakeGpu(utilization=97, temperature=84, power_mw=650_500, reasons=0x4 | 0x20, memory_used=80 * 2**30)
    fake = install_fake_nvml(monkeypatch, [card])
    written = []
    sampler = Sampler(written.append, interval_s=0.05).start()
    assert wait_for(lambda: written)
    card.temperature = 91  # the next reading sees the change
    assert wait_for(lambda: written[-1]["gpus"][0]["temperature_c"] == 91)
    sampler.stop()
    gpu = written[0]["gpus"][0]
    assert GPU_FIELDS <= set(gpu) and gpu["name"] == "NVIDIA H200"
    assert gpu["utilization_pct"] == 97 and gpu["temperature_c"] == 84 and gpu["power_w"] == 650.5
    assert gpu["memory_used_bytes"] == 80 * 2**30 and gpu["fan_pct"] is None
    assert gpu["throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert fake.state["initialised"] == 0


def test_a_failing_writer_does_not_kill_the_thread(monkeypatch):
    install_fake_nvml(monkeypatch, [], init_error="Driver Not Loaded")
    calls = []

    def write(sample):
        calls.append(sample)
        raise OSError("No space left on device")

    sampler = Sampler(write, interval_s=0.02).start()
    assert wait_for(lambda: len(calls) >= 3)
    sampler.stop()
    assert sampler.errors >= 3


def test_throttle_reason_names():
    assert throttle_reason_names(0) == [] and throttle_reason_names(None) is None
    assert throttle_reason_names(0x1 | 0x8 | 0x80) == ["gpu_idle", "hw_slowdown", "hw_power_brake_slowdown"]
