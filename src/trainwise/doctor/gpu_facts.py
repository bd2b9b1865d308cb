"""What the NVIDIA driver says about each GPU, read through NVML: identity, memory, temperature and its
limits, power, clocks, throttling, ECC and row remapping, persistence mode, and the processes already on the
card. Part of `Facts` (facts.py); gpu_health.py decides from these facts alone.

The probe only reads; a missing driver or library is a normal answer (`NvmlFacts.available` False, with the
reason), never an error.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GpuProcess:
    pid: int
    name: str | None = None
    used_memory_bytes: int | None = None


@dataclass
class GpuFacts:
    index: int
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_capability: list[int] | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    slowdown_temperature_c: int | None = None
    shutdown_temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    fan_pct: int | None = None
    """None on passively cooled (datacenter) cards."""
    throttle_reasons: list[str] | None = None
    ecc_enabled: bool | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    """Since the last driver load; > 0 means the card returned bad memory reads."""
    ecc_uncorrected_aggregate: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    persistence_mode: bool | None = None
    processes: list[GpuProcess] = field(default_factory=list)


@dataclass
class NvmlFacts:
    available: bool
    error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    """The newest CUDA the driver supports, e.g. "12.4"."""
    gpus: list[GpuFacts] = field(default_factory=list)


def probe_nvml() -> NvmlFacts:
    from trainwise.telemetry.nvml import open_nvml

    session, error = open_nvml()
    if session is None:
        return NvmlFacts(available=False, error=error)
    n, read = session.nvml, session.read
    try:
        cuda = read(n.nvmlSystemGetCudaDriverVersion)  # e.g. 12040 -> "12.4"
        facts = NvmlFacts(available=True, driver_version=_text(read(n.nvmlSystemGetDriverVersion)),
                          cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None)
        for i, h in enumerate(session.handles):
            live = session.sample(i)
            pci = read(n.nvmlDeviceGetPciInfo, h)
            remap = read(n.nvmlDeviceGetRemappedRows, h)  # (corrected, uncorrected, pending, failure)
            ecc = read(n.nvmlDeviceGetEccMode, h)  # (current, pending)
            cc = read(n.nvmlDeviceGetCudaComputeCapability, h)
            facts.gpus.append(GpuFacts(
                index=i, name=_text(read(n.nvmlDeviceGetName, h)) or f"GPU {i}",
                uuid=_text(read(n.nvmlDeviceGetUUID, h)), pci_bus_id=_text(pci.busId) if pci else None,
                compute_capability=list(cc) if cc else None,
                memory_total_bytes=live["memory_total_bytes"], memory_used_bytes=live["memory_used_bytes"],
                utilization_pct=live["utilization_pct"], temperature_c=live["temperature_c"],
                slowdown_temperature_c=read(n.nvmlDeviceGetTemperatureThreshold, h,
                                            n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                shutdown_temperature_c=read(n.nvmlDeviceGetTemperatureThreshold, h,
                                            n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
                power_w=live["power_w"], power_limit_w=live["power_limit_w"], sm_clock_mhz=live["sm_clock_mhz"],
                max_sm_clock_mhz=read(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM), fan_pct=live["fan_pct"],
                throttle_reasons=live["throttle_reasons"],
                ecc_enabled=bool(ecc[0]) if ecc else None,
                ecc_corrected_volatile=read(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                            n.NVML_VOLATILE_ECC),
                ecc_uncorrected_volatile=read(n.nvmlDeviceGetTotalEccErrors, h,
                                              n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
                ecc_uncorrected_aggregate=read(n.nvmlDeviceGetTotalEccErrors, h,
                                               n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
                row_remap_pending=bool(remap[2]) if remap else None,
                row_remap_failure=bool(remap[3]) if remap else None,
                persistence_mode=_flag(read(n.nvmlDeviceGetPersistenceMode, h)),
                processes=[GpuProcess(pid=p.pid, name=_text(read(n.nvmlSystemGetProcessName, p.pid)),
                                      used_memory_bytes=p.usedGpuMemory)
                           for p in (read(n.nvmlDeviceGetComputeRunningProcesses, h) or []) if p.pid != os.getpid()],
            ))
        return facts
    finally:
        session.close()


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
