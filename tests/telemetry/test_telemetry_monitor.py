"""`trainwise monitor`: the screen, the JSON output and the log file, with and without GPUs."""
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.doctor.fake_nvml import FakeGpu, install_fake_nvml
from trainwise.cli import app
from trainwise.errors import ConfigError
from trainwise.findings import Finding
from trainwise.telemetry.monitor import render, run_monitor


def screen(renderable) -> str:
    console = Console(width=160, record=True)
    console.print(renderable)
    return console.export_text()


def test_screen_shows_every_gpu_field_and_alerts():
    sample = {"time": 0.0, "cpu_percent": 35.0, "ram_used_bytes": 8 * 2**30, "ram_total_bytes": 64 * 2**30,
              "ram_percent": 12.5, "disk_read_bytes_per_s": 250 * 2**20,
              "gpus": [{"index": 0, "name": "NVIDIA H200", "utilization_pct": 97, "memory_used_bytes": 70 * 2**30,
                        "memory_total_bytes": 140 * 2**30, "temperature_c": 84, "power_w": 650.0,
                        "power_limit_w": 700.0, "sm_clock_mhz": 1755, "fan_pct": None,
                        "throttle_reasons": ["gpu_idle", "sw_thermal_slowdown"]}]}
    text = screen(render(sample, None, [Finding("gpu_temperature", "warn", "GPU 0 at 84 °C")]))
    for expected in ("NVIDIA H200", "97%", "70.0/140 GiB", "84 °C", "650/700 W", "1755 MHz", "sw_thermal_slowdown",
                     "CPU 35%", "250.0 MB/s", "warn: GPU 0 at 84 °C"):
        assert expected in text
    assert "gpu_idle" not in text


def test_without_gpu_it_says_so_and_shows_the_host(monkeypatch):
    install_fake_nvml(monkeypatch, [], init_error="NVML Shared Library Not Found")
    console = Console(width=160, record=True)
    samples = run_monitor(interval_s=0.1, once=True, console=console)
    text = console.export_text()
    assert len(samples) == 1 and samples[0]["gpus"] == []
    assert "No NVIDIA GPU found" in text and "CPU" in text and "RAM" in text


def test_log_file_gets_every_sample_and_alerts_show(monkeypatch, tmp_path):
    install_fake_nvml(monkeypatch, [FakeGpu(temperature=93)])
    log = tmp_path / "telemetry.jsonl"
    console = Console(width=160, record=True)
    run_monitor(interval_s=0.1, log_path=log, console=console, max_samples=3)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 3 and lines[0]["gpus"][0]["temperature_c"] == 93
    assert "error: GPU 0 at 93 °C" in console.export_text()


def test_cli_once_json(monkeypatch):
    install_fake_nvml(monkeypatch, [FakeGpu(), FakeGpu(name="NVIDIA H100 80GB HBM3")])
    result = CliRunner().invoke(app, ["monitor", "--once", "--json", "--interval", "0.1"])
    assert result.exit_code == 0, result.output
    sample = json.loads(result.stdout)
    assert [g["name"] for g in sample["gpus"]] == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    assert {"cpu_percent", "ram_used_bytes", "disk_read_bytes_per_s"} <= set(sample)


@pytest.mark.parametrize("kwargs, message", [({"interval_s": 0}, "at least 0.1"),
                                             ({"log_path": "missing/dir/t.jsonl"}, "does not exist")])
def test_bad_options_are_user_errors(tmp_path, kwargs, message):
    if "log_path" in kwargs:
        kwargs = {"log_path": tmp_path / kwargs["log_path"]}
    with pytest.raises(ConfigError, match=message):
        run_monitor(once=True, **kwargs)


def test_once_is_one_json_line_after_a_full_cpu_window_and_does_not_say_ctrl_c(monkeypatch, capsys):
    import trainwise.telemetry.monitor as monitor

    install_fake_nvml(monkeypatch, [FakeGpu()])
    waits = []
    monkeypatch.setattr(monitor.time, "sleep", waits.append)
    run_monitor(interval_s=0.1, once=True, as_json=True)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["gpus"]  # help: "one line per sample"
    assert waits == [monitor.FIRST_READING_WAIT_S]  # CPU % over a real window, not over 0.1 s
    console = Console(width=160, record=True)
    run_monitor(interval_s=0.1, once=True, console=console)
    assert "Ctrl-C" not in console.export_text()
    console = Console(width=160, record=True, force_terminal=True)   # the live view of a terminal
    run_monitor(interval_s=0.1, max_samples=2, console=console)
    assert "Ctrl-C to quit" in console.export_text()


def test_once_ends_its_line_and_shows_no_rate_from_one_sample(monkeypatch):
    import io

    install_fake_nvml(monkeypatch, [FakeGpu()])
    out = io.StringIO()
    samples = run_monitor(interval_s=0.1, once=True, console=Console(file=out, width=160))
    assert out.getvalue().endswith("\n")
    assert "disk read" not in out.getvalue() and samples[0]["disk_read_bytes_per_s"] is None


def test_piped_without_json_prints_every_sample(monkeypatch):
    import io
    import re

    install_fake_nvml(monkeypatch, [FakeGpu()])
    out = io.StringIO()   # not a terminal: no live view to redraw in place
    run_monitor(interval_s=0.1, max_samples=3, console=Console(file=out, width=160))
    text = out.getvalue()
    assert len(re.findall(r"^\d\d:\d\d:\d\d$", text, re.M)) == 3, text   # one clock line per sample
    assert text.count("NVIDIA H200") == 3 and text.count("disk read") == 2 and "Ctrl-C" not in text
