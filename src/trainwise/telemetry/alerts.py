"""Telemetry alerts: pure rules from samples (and the trainer's data-wait share) to findings.

Each alert is the product's one record, a `trainwise.findings.Finding` (its `code` is the `kind` written to
events.jsonl: gpu_temperature, gpu_throttle, data_starvation). A condition raises one finding when it starts
or gets worse, not one per sample; it re-arms once it clears.
`temperature_level` and `throttle_level` are the product's one judgement of a GPU's temperature and clocks:
`trainwise doctor` grades a card with them too, so a card the doctor passes does not alert while training.
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from trainwise.config import TelemetryConfig
from trainwise.errors import ConfigError
from trainwise.findings import LEGACY_SEVERITY, SEVERITY_ORDER, Finding, Severity
from trainwise.telemetry.nvml import HARDWARE_REASONS, POWER_REASONS, THERMAL_REASONS

STARVED_LOGS_IN_A_ROW = 2  # the first log window includes worker start-up: one high reading proves nothing
BUSY_UTILIZATION_PCT = 50  # a card this busy at its power limit is working as designed


def thresholds_from(**fields: Any) -> TelemetryConfig:
    """A TelemetryConfig from user-given thresholds, with a ConfigError that names the bad one."""
    try:
        return TelemetryConfig(**fields)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(map(str, first["loc"]))  # empty for a rule across fields (warning below failure)
        raise ConfigError(f"telemetry{'.' + where if where else ''}: "
                          f"{first['msg'].removeprefix('Value error, ')}") from None


def temperature_level(temperature_c: float | None, settings: TelemetryConfig) -> str | None:
    """None, "warning" (≥ warn) or "error" (≥ fail)."""
    if temperature_c is None:
        return None
    if temperature_c >= settings.temperature_fail_c:
        return "error"
    if temperature_c >= settings.temperature_warn_c:
        return "warning"
    return None


def throttle_level(reasons: list[str] | None,
                   utilization_pct: float | None = None) -> tuple[str, list[str]] | None:
    """(severity, the reasons that matter) for the throttle reasons that cost speed, else None.

    Hardware slowdown is an error (overheating, or the power supply cannot deliver); thermal throttling a
    warning. A power cap is only worth knowing (info) on a busy card, or one whose load is unknown: drawing the
    full power limit under load is normal. On a nearly idle card it is a warning: the limit was lowered."""
    active = set(reasons or [])
    if hardware := sorted(active & set(HARDWARE_REASONS)):
        return "error", hardware
    if thermal := sorted(active & set(THERMAL_REASONS)):
        return "warning", thermal
    if power := sorted(active & set(POWER_REASONS)):
        idle = utilization_pct is not None and utilization_pct < BUSY_UTILIZATION_PCT
        return ("warning" if idle else "info"), power
    return None


def cooling_fix(gpu: Any) -> str:
    """What to do about a hot card (the alert's fix and the doctor's)."""
    return (f"Check the cooling: airflow and fans, dust, inlet temperature; watch it with `nvidia-smi -q -i {gpu} "
            "-d TEMPERATURE,PERFORMANCE`.")


def is_starved(data_wait_fraction: float, gpu_utilization: list[float], settings: TelemetryConfig) -> bool:
    """The step waits on data a lot while the GPUs idle. With no GPU, the data wait alone decides."""
    if data_wait_fraction <= settings.starvation_wait_above:
        return False
    if not gpu_utilization:
        return True
    return sum(gpu_utilization) / len(gpu_utilization) < settings.starvation_util_below


class AlertRules:
    """Remembers which conditions are active so each episode is reported once. No I/O."""

    def __init__(self, settings: TelemetryConfig):
        self.settings = settings
        self._active: dict[tuple, str] = {}
        self._starved_in_a_row = 0

    def check_sample(self, sample: dict[str, Any]) -> list[Finding]:
        alerts = []
        for gpu in sample.get("gpus") or []:
            i, temp = gpu.get("index"), gpu.get("temperature_c")
            level = temperature_level(temp, self.settings)
            if self._starts(("temperature", i), level):
                limit = self.settings.temperature_fail_c if level == "error" else self.settings.temperature_warn_c
                alerts.append(Finding(
                    "gpu_temperature", _severity(level), f"GPU {i} at {temp} °C (≥ {limit:g} °C)",
                    "Past the warning threshold the card nears thermal slowdown; past the failure one it slows "
                    "itself down and risks damage.",
                    {"gpu": i, "temperature_c": temp, "threshold_c": limit, "fan_pct": gpu.get("fan_pct")},
                    [cooling_fix(i)]))
            throttle = throttle_level(gpu.get("throttle_reasons"), gpu.get("utilization_pct"))
            if self._starts(("throttle", i), throttle[0] if throttle else None):
                level, reasons = throttle
                why = ("A busy card at its power limit: normal, worth knowing." if level == "info" else
                       "The card runs below its clocks, so every step is slower.")
                alerts.append(Finding(
                    "gpu_throttle", _severity(level), f"GPU {i} clocks throttled: {', '.join(reasons)} "
                    f"(SM {gpu.get('sm_clock_mhz')} MHz)", why,
                    {"gpu": i, "reasons": reasons, "sm_clock_mhz": gpu.get("sm_clock_mhz"),
                     "power_w": gpu.get("power_w"), "temperature_c": temp},
                    [f"nvidia-smi -q -i {i} -d PERFORMANCE,POWER,TEMPERATURE   # then check cooling, the power "
                     "limit and the power supply"]))
        return alerts

    def check_starvation(self, data_wait_fraction: float, gpu_utilization: list[float]) -> list[Finding]:
        starved = is_starved(data_wait_fraction, gpu_utilization, self.settings)
        self._starved_in_a_row = self._starved_in_a_row + 1 if starved else 0
        level = "warning" if self._starved_in_a_row >= STARVED_LOGS_IN_A_ROW else None
        if not self._starts(("starvation",), level, clear=not starved):
            return []
        util = f", GPU utilisation {sum(gpu_utilization) / len(gpu_utilization):.0f}%" if gpu_utilization else ""
        return [Finding("data_starvation", "warn", f"data-starved: {data_wait_fraction:.0%} of step time waits for "
                        f"data{util}", "The training step waits for the DataLoader while the device idles.",
                        {"data_wait_fraction": data_wait_fraction, "gpu_utilization_pct": gpu_utilization,
                         "wait_above": self.settings.starvation_wait_above,
                         "util_below": self.settings.starvation_util_below},
                        ["Raise data.num_workers (or data.num_workers=auto).",
                         "Prepare the data into shards (`trainwise prepare`) so workers only read them.",
                         "Lighten augmentation; measure with `trainwise data bench`."])]

    def _starts(self, key: tuple, level: str | None, *, clear: bool | None = None) -> bool:
        """True when `level` is new or worse than what is active for `key`; forgets `key` once it clears."""
        if level is None:
            if clear is None or clear:
                self._active.pop(key, None)
            return False
        active = self._active.get(key)
        if active is not None and SEVERITY_ORDER[_severity(level)] <= SEVERITY_ORDER[_severity(active)]:
            return False
        self._active[key] = level
        return True


def _severity(level: str) -> Severity:
    """A level of `temperature_level`/`throttle_level` (info, warning, error) as a Finding's severity."""
    return LEGACY_SEVERITY.get(level, level)  # type: ignore[return-value]
