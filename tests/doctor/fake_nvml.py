"""A stand-in for the `pynvml` module (nvidia-ml-py), following the NVML API reference: values in NVML's
units (bytes, mW, MHz, °C), NVMLError_NotSupported for fields a card lacks. Install it with
`install_fake_nvml(monkeypatch, gpus)`; mutate `FakeGpu` fields to change what the next reading sees."""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

MIB = 2**20


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    def __str__(self):
        return "Not Supported"


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    cc: tuple = (9, 0)
    memory_total: int = 143771 * MIB
    memory_used: int = 1 * MIB
    utilization: int = 0
    temperature: int = 31
    power_mw: int = 76_000
    power_limit_mw: int = 700_000
    sm_clock: int = 345
    max_sm_clock: int = 1980
    fan: int | None = None  # passively cooled
    reasons: int = 0x1  # gpu idle
    ecc: bool | None = True
    uncorrected_volatile: int = 0
    persistence: int = 1
    processes: list = field(default_factory=list)  # [(pid, used bytes)]


def make_module(gpus: list[FakeGpu], *, init_error: str | None = None, driver="570.124.06", cuda=12080):
    m = types.ModuleType("pynvml")
    m.NVMLError, m.NVMLError_NotSupported = NVMLError, NVMLError_NotSupported
    m.NVML_TEMPERATURE_GPU, m.NVML_CLOCK_SM = 0, 1
    m.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, m.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 0, 1
    m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    m.NVML_VOLATILE_ECC, m.NVML_AGGREGATE_ECC = 0, 1
    m.state = {"initialised": 0}

    def init():
        if init_error:
            raise NVMLError(init_error)
        m.state["initialised"] += 1

    def shutdown():
        m.state["initialised"] -= 1

    def ns(*a):
        raise NVMLError_NotSupported()

    m.nvmlInit, m.nvmlShutdown = init, shutdown
    m.nvmlSystemGetDriverVersion = lambda: driver
    m.nvmlSystemGetCudaDriverVersion = lambda: cuda
    m.nvmlSystemGetProcessName = lambda pid: "python"
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    m.nvmlDeviceGetName = lambda g: g.name
    m.nvmlDeviceGetUUID = lambda g: f"GPU-{id(g):x}"
    m.nvmlDeviceGetPciInfo = lambda g: types.SimpleNamespace(busId="00000000:18:00.0")
    m.nvmlDeviceGetCudaComputeCapability = lambda g: g.cc
    m.nvmlDeviceGetMemoryInfo = lambda g: types.SimpleNamespace(total=g.memory_total, used=g.memory_used,
                                                                free=g.memory_total - g.memory_used)
    m.nvmlDeviceGetUtilizationRates = lambda g: types.SimpleNamespace(gpu=g.utilization, memory=0)
    m.nvmlDeviceGetTemperature = lambda g, sensor: g.temperature
    m.nvmlDeviceGetTemperatureThreshold = lambda g, kind: {0: 95, 1: 90}[kind]
    m.nvmlDeviceGetPowerUsage = lambda g: g.power_mw
    m.nvmlDeviceGetEnforcedPowerLimit = lambda g: g.power_limit_mw
    m.nvmlDeviceGetClockInfo = lambda g, clock: g.sm_clock
    m.nvmlDeviceGetMaxClockInfo = lambda g, clock: g.max_sm_clock
    m.nvmlDeviceGetFanSpeed = lambda g: ns() if g.fan is None else g.fan
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda g: g.reasons
    m.nvmlDeviceGetEccMode = lambda g: ns() if g.ecc is None else (int(g.ecc), int(g.ecc))
    m.nvmlDeviceGetTotalEccErrors = lambda g, kind, counter: ns() if g.ecc is None else (
        g.uncorrected_volatile if kind == 1 and counter == 0 else 0)
    m.nvmlDeviceGetRemappedRows = lambda g: ns() if g.ecc is None else (0, 0, 0, 0)
    m.nvmlDeviceGetPersistenceMode = lambda g: g.persistence
    m.nvmlDeviceGetComputeRunningProcesses = lambda g: [types.SimpleNamespace(pid=p, usedGpuMemory=b)
                                                        for p, b in g.processes]
    return m


def install_fake_nvml(monkeypatch, gpus: list[FakeGpu], **kwargs):
    module = make_module(gpus, **kwargs)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module
