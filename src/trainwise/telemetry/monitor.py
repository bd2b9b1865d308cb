"""`trainwise monitor`: a live terminal view of every GPU (utilisation, memory, temperature, power, SM clock,
throttling) and the host, with the same alerts as training-time telemetry. Without an NVIDIA GPU it says so
and shows CPU, RAM and disk."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from trainwise.config import TelemetryConfig
from trainwise.errors import ConfigError
from trainwise.findings import Finding
from trainwise.telemetry.alerts import AlertRules
from trainwise.telemetry.nvml import open_nvml
from trainwise.telemetry.sampler import HostMeter, read_sample

GIB = 2**30
FIRST_READING_WAIT_S = 0.5  # CPU % and disk rates need a window before the first reading; --once waits it in full
SHOWN_ALERTS = 5
MIN_INTERVAL_S = 0.1


def run_monitor(*, interval_s: float = 2.0, log_path: Path | None = None, once: bool = False,
                as_json: bool = False, console: Console | None = None, settings: TelemetryConfig | None = None,
                max_samples: int | None = None) -> list[dict[str, Any]]:
    """Sample every `interval_s` until Ctrl-C (or once, or `max_samples`), showing and optionally logging each
    sample. Returns the samples taken."""
    if not interval_s >= MIN_INTERVAL_S:
        raise ConfigError(f"--interval {interval_s:g}: the interval must be at least {MIN_INTERVAL_S} s, e.g. --interval 1")
    console = console or Console()
    log = _open_log(log_path)
    nvml, nvml_error = open_nvml()
    host, rules = HostMeter(), AlertRules(settings or TelemetryConfig())
    limit = 1 if once else max_samples
    samples: list[dict[str, Any]] = []
    alerts: list[Finding] = []
    live = None
    try:
        time.sleep(FIRST_READING_WAIT_S if once else min(interval_s, FIRST_READING_WAIT_S))
        # a live view redraws in place on a terminal; piped, or for one sample, each sample is printed in turn
        if not as_json and limit != 1 and console.is_terminal:
            live = Live(console=console, auto_refresh=False, transient=False)
            live.start()
        while limit is None or len(samples) < limit:
            sample = read_sample(nvml, host)
            if not samples:  # a rate needs two readings of this monitor's own: the first has none
                sample["disk_read_bytes_per_s"] = None
            samples.append(sample)
            alerts = (alerts + rules.check_sample(sample))[-SHOWN_ALERTS:]
            if log is not None:
                log.write(json.dumps(sample) + "\n")
                log.flush()
            if as_json:
                print(json.dumps(sample), flush=True)  # one line per sample, --once included
            elif live is not None:
                live.update(render(sample, nvml_error, alerts), refresh=True)
            else:
                console.print(render(sample, nvml_error, alerts, live=False))
                console.file.flush()
            if limit is not None and len(samples) >= limit:
                break
            time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
        if log is not None:
            log.close()
        if nvml is not None:
            nvml.close()
    return samples


def render(sample: dict[str, Any], nvml_error: str | None = None, alerts: list[Finding] = (),
           live: bool = True) -> Group:
    """The monitor screen for one sample; `live=False` (one sample, then exit) has no "Ctrl-C to quit"."""
    parts: list[Any] = []
    gpus = sample.get("gpus") or []
    if gpus:
        table = Table("GPU", "name", "util", "memory", "temp", "power", "SM clock", "fan", "throttle",
                      box=None, header_style="bold")
        for g in gpus:
            table.add_row(str(g["index"]), g.get("name") or "", _pct(g.get("utilization_pct")),
                          _memory(g.get("memory_used_bytes"), g.get("memory_total_bytes")),
                          _temperature(g.get("temperature_c")), _power(g.get("power_w"), g.get("power_limit_w")),
                          _value(g.get("sm_clock_mhz"), " MHz"), _pct(g.get("fan_pct")),
                          _throttle(g.get("throttle_reasons")))
        parts.append(table)
    else:
        parts.append(Text(f"No NVIDIA GPU found ({nvml_error or 'NVML reports no devices'}); "
                          "showing host metrics only.", style="yellow"))
    disk = sample.get("disk_read_bytes_per_s")  # None for the first sample: no rate from one reading
    parts.append(Text(f"host  CPU {sample['cpu_percent']:.0f}%   RAM {sample['ram_used_bytes'] / GIB:.1f} of "
                      f"{sample['ram_total_bytes'] / GIB:.0f} GiB ({sample['ram_percent']:.0f}%)"
                      + ("" if disk is None else f"   disk read {disk / 2**20:.1f} MB/s")))
    for a in alerts:
        parts.append(Text(f"{a.severity}: {a.title}", style="red" if a.severity == "error" else "yellow"))
    clock = time.strftime("%H:%M:%S", time.localtime(sample["time"]))
    parts.append(Text(clock + ("  Ctrl-C to quit" if live else ""), style="dim"))
    return Group(*parts)


def _open_log(path: Path | None):
    if path is None:
        return None
    if path.is_dir():
        raise ConfigError(f"--log {path} is a directory; give a file name, e.g. {path}/telemetry.jsonl")
    if not path.parent.is_dir():
        raise ConfigError(f"--log {path}: the folder {path.parent} does not exist; create it first.")
    return open(path, "a", encoding="utf-8")


def _pct(value) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _value(value, unit: str) -> str:
    return "-" if value is None else f"{value}{unit}"


def _memory(used, total) -> str:
    if used is None or total is None:
        return "-"
    return f"{used / GIB:.1f}/{total / GIB:.0f} GiB"


def _temperature(value) -> str:
    if value is None:
        return "-"
    style = "red" if value >= 90 else "yellow" if value >= 80 else ""
    return f"[{style}]{value} °C[/]" if style else f"{value} °C"


def _power(power, limit) -> str:
    if power is None:
        return "-"
    return f"{power:.0f}/{limit:.0f} W" if limit else f"{power:.0f} W"


def _throttle(reasons) -> str:
    shown = [r for r in reasons or [] if r != "gpu_idle"]
    return ", ".join(shown) if shown else "-"
