"""A thin, failure-tolerant layer over nvidia-ml-py (NVML), shared by `trainwise doctor`, the training-time
sampler and `trainwise monitor`.

No NVIDIA driver, no library, no permission: `open_nvml()` says why and returns None for the session;
callers then work on host metrics only. A field a card does not support (fan on a passively cooled card,
ECC on a GeForce) reads as None instead of failing the whole reading.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

# NVML clocks-event ("throttle") reason bits, from nvml.h `nvmlClocksEventReason*`.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that cost speed and point at cooling or power; the others are normal operation.
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")
POWER_REASONS = ("sw_power_cap", "hw_power_brake_slowdown")
HARDWARE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def throttle_reason_names(mask: int | None) -> list[str] | None:
    """The names of the bits set in an NVML clocks-event mask."""
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


@dataclass
class NvmlSession:
    """NVML initialised, with one handle per GPU. `close()` when done."""

    nvml: Any
    handles: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # already shut down, or the driver went away: nothing left to release
            pass

    def read(self, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`, or None when this card/driver does not support it."""
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def sample(self, index: int) -> dict[str, Any]:
        """Live state of GPU `index`: the fields `system.jsonl` and `trainwise monitor` show."""
        n, h = self.nvml, self.handles[index]
        util = self.read(n.nvmlDeviceGetUtilizationRates, h)
        memory = self.read(n.nvmlDeviceGetMemoryInfo, h)
        power_mw = self.read(n.nvmlDeviceGetPowerUsage, h)
        limit_mw = self.read(n.nvmlDeviceGetEnforcedPowerLimit, h)
        return {
            "index": index,
            "name": self.names[index] if index < len(self.names) else None,
            "utilization_pct": util.gpu if util is not None else None,
            "memory_used_bytes": memory.used if memory is not None else None,
            "memory_total_bytes": memory.total if memory is not None else None,
            "temperature_c": self.read(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "power_limit_w": limit_mw / 1000 if limit_mw is not None else None,
            "sm_clock_mhz": self.read(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            "fan_pct": self.read(n.nvmlDeviceGetFanSpeed, h),
            "throttle_reasons": throttle_reason_names(self.read(_clocks_event_reasons(n), h)),
        }

    def samples(self) -> list[dict[str, Any]]:
        with self._lock:  # NVML is thread-safe, but a shared session is closed from another thread
            return [self.sample(i) for i in range(len(self.handles))]


def open_nvml() -> tuple[NvmlSession | None, str | None]:
    """(session, None) when NVML works, else (None, why): no library, no driver, no permission."""
    try:
        import pynvml
    except ImportError as error:  # nvidia-ml-py is a dependency, but a broken env should still run
        return None, f"nvidia-ml-py is not importable: {error}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return None, _nvml_error_text(error)
    except OSError as error:
        return None, str(error)
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    except pynvml.NVMLError as error:
        pynvml.nvmlShutdown()
        return None, _nvml_error_text(error)
    session = NvmlSession(pynvml, handles)
    session.names = [_text(session.read(pynvml.nvmlDeviceGetName, h)) or f"GPU {i}" for i, h in enumerate(handles)]
    return session, None


def _clocks_event_reasons(nvml: Any) -> Callable[..., int]:
    # renamed in NVML 12.2 ("throttle" -> "clocks event"); older bindings have only the old name
    return getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_error_text(error: Exception) -> str:
    text = str(error)
    if "Library Not Found" in text or "Driver Not Loaded" in text:
        return f"{text} (no NVIDIA driver on this machine)"
    return text
