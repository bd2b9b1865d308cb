"""GPU health, pure over `GpuFacts`: temperature, throttling, memory errors, persistence mode, and whether
someone else is already on the card."""
from __future__ import annotations

from trainwise.config import TelemetryConfig
from trainwise.doctor.gpu_facts import GpuFacts
from trainwise.findings import Finding
from trainwise.telemetry.alerts import cooling_fix, temperature_level, throttle_level
from trainwise.telemetry.nvml import POWER_REASONS

GIB = 2**30
BUSY_FRACTION = 0.05  # an idle card holds a few hundred MB of driver state; more means another job
# Temperature and clocks are judged by telemetry's rules (one owner); its levels as a Finding's severity.
SEVERITY_OF_LEVEL = {None: "info", "info": "info", "warning": "warn", "error": "error"}


def gpu_health_findings(gpus: list[GpuFacts], thresholds: TelemetryConfig) -> list[Finding]:
    findings = []
    for gpu in gpus:
        findings += [temperature(gpu, thresholds), throttling(gpu), memory_errors(gpu), persistence(gpu),
                     in_use(gpu)]
    return [f for f in findings if f is not None]


def temperature(g: GpuFacts, t: TelemetryConfig) -> Finding | None:
    if g.temperature_c is None:
        return None
    code, title = "gpu_temperature", f"GPU {g.index} temperature"
    evidence = {"gpu": g.index, "temperature_c": g.temperature_c, "warn_c": t.temperature_warn_c,
                "fail_c": t.temperature_fail_c, "slowdown_c": g.slowdown_temperature_c, "fan_pct": g.fan_pct,
                "utilization_pct": g.utilization_pct}
    fan = "" if g.fan_pct is None else f", fan {g.fan_pct}%"
    line = f"{g.name} at {g.temperature_c} °C{fan}"
    fix = cooling_fix(g.index)
    level = temperature_level(g.temperature_c, t)
    if g.fan_pct == 0 and level is not None:
        return Finding(code, "error", title, f"{line}: hot and the fan is not spinning", evidence, fix)
    if level == "error":
        return Finding(code, "error", title,
                       f"{line} (≥ {t.temperature_fail_c:.0f} °C): the card slows itself down and "
                       "risks damage", evidence, fix)
    if level == "warning":
        return Finding(code, "warn", title, f"{line} (≥ {t.temperature_warn_c:.0f} °C): close to thermal slowdown",
                       evidence, fix)
    return Finding(code, "info", title, line, evidence)


def throttling(g: GpuFacts) -> Finding | None:
    if g.throttle_reasons is None:
        return None
    code, title = "gpu_throttle", f"GPU {g.index} clocks"
    evidence = {"gpu": g.index, "throttle_reasons": g.throttle_reasons, "sm_clock_mhz": g.sm_clock_mhz,
                "max_sm_clock_mhz": g.max_sm_clock_mhz, "power_w": g.power_w, "power_limit_w": g.power_limit_w}
    clocks = f" (SM {g.sm_clock_mhz} of {g.max_sm_clock_mhz} MHz)" if g.sm_clock_mhz and g.max_sm_clock_mhz else ""
    judged = throttle_level(g.throttle_reasons, g.utilization_pct)
    if judged is None:
        return Finding(code, "info", title, f"not throttled{clocks}", evidence)
    level, reasons = judged
    severity, names = SEVERITY_OF_LEVEL[level], ", ".join(reasons)
    if level == "error":
        return Finding(code, severity, title, f"hardware slowdown active: {names}{clocks}: overheating or the power "
                       "supply cannot deliver", evidence,
                       f"nvidia-smi -q -i {g.index} -d PERFORMANCE,POWER,TEMPERATURE   # then check cooling and "
                       "PSU/power cables")
    if reasons[0] in POWER_REASONS:  # checked after hardware: a power brake is both
        limit = f" at {g.power_limit_w:.0f} W" if g.power_limit_w else ""
        if severity == "info":
            load = f" under load ({g.utilization_pct}% busy)" if g.utilization_pct is not None else ""
            return Finding(code, "info", title, f"power capped{limit}{load}: normal for a card drawing its full "
                           f"power{clocks}", evidence)
        return Finding(code, severity, title, f"power capped{limit} while nearly idle: {names}{clocks}", evidence,
                       f"nvidia-smi -q -i {g.index} -d POWER   # if the limit was lowered: sudo nvidia-smi -i "
                       f"{g.index} -pl <default limit>")
    return Finding(code, severity, title, f"thermal throttling: {names}{clocks}", evidence,
                   "Improve cooling (airflow, fan curve, room temperature); training runs slower until then.")


def memory_errors(g: GpuFacts) -> Finding | None:
    if g.ecc_enabled is None and g.row_remap_pending is None:
        return None  # consumer cards: no ECC to read
    code, title = "gpu_memory_errors", f"GPU {g.index} memory errors"
    evidence = {"gpu": g.index, "ecc_enabled": g.ecc_enabled, "corrected_volatile": g.ecc_corrected_volatile,
                "uncorrected_volatile": g.ecc_uncorrected_volatile,
                "uncorrected_aggregate": g.ecc_uncorrected_aggregate, "row_remap_pending": g.row_remap_pending,
                "row_remap_failure": g.row_remap_failure}
    reset = f"sudo nvidia-smi -r -i {g.index}"
    if g.row_remap_failure:
        return Finding(code, "error", title,
                       "row remapping failed: the card has run out of spare memory rows", evidence,
                       "Take the card out of service and ask the provider/vendor for a replacement (RMA).")
    if g.ecc_uncorrected_volatile:
        return Finding(code, "error", title,
                       f"{g.ecc_uncorrected_volatile} uncorrectable ECC error(s) since the driver "
                       "loaded: results on this card cannot be trusted", evidence,
                       f"Stop jobs on GPU {g.index}, reset it ({reset}); if errors return, request an RMA.")
    if g.row_remap_pending:
        return Finding(code, "warn", title,
                       "a memory row remap is pending: it takes effect after a GPU reset", evidence,
                       f"Stop jobs on GPU {g.index}, then {reset}")
    if g.ecc_uncorrected_aggregate:
        return Finding(code, "warn", title, f"{g.ecc_uncorrected_aggregate} uncorrectable ECC error(s) over the card's "
                       "life (none since the driver loaded)", evidence,
                       f"nvidia-smi -q -i {g.index} -d ECC,ROW_REMAPPER   # watch whether the count grows")
    if g.ecc_enabled is False:
        return Finding(code, "info", title, "ECC is off: memory errors go undetected", evidence,
                       f"sudo nvidia-smi -i {g.index} -e 1 && {reset}   # costs a few % memory")
    return Finding(code, "info", title, "no uncorrectable ECC errors", evidence)


def persistence(g: GpuFacts) -> Finding | None:
    if g.persistence_mode is None:
        return None
    code, title = "gpu_persistence", f"GPU {g.index} persistence mode"
    if g.persistence_mode:
        return Finding(code, "info", title, "persistence mode on", {"gpu": g.index, "persistence_mode": True})
    return Finding(code, "warn", title, "persistence mode off: the driver unloads between jobs, so every start waits "
                   "seconds to re-initialise the GPU", {"gpu": g.index, "persistence_mode": False},
                   "sudo systemctl enable --now nvidia-persistenced   # or: sudo nvidia-smi -pm 1")


def in_use(g: GpuFacts) -> Finding | None:
    if g.memory_total_bytes is None or g.memory_used_bytes is None:
        return None
    code, title = "gpu_in_use", f"GPU {g.index} in use"
    used, total = g.memory_used_bytes, g.memory_total_bytes
    evidence = {"gpu": g.index, "memory_used_bytes": used, "memory_total_bytes": total,
                "utilization_pct": g.utilization_pct,
                "processes": [{"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes}
                              for p in g.processes]}
    line = f"{used / GIB:.1f} of {total / GIB:.0f} GiB used"
    if g.processes or used > BUSY_FRACTION * total:
        who = ", ".join(f"{p.name or '?'} (pid {p.pid})" for p in g.processes[:3]) or \
              "processes not visible from here (another container?)"
        return Finding(code, "warn", title, f"{line} by {len(g.processes) or 'unknown'} other process(es): {who}; "
                       "your run gets what is left", evidence,
                       f"nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv -i {g.index}"
                       "   # then stop them, or pick another GPU with CUDA_VISIBLE_DEVICES")
    return Finding(code, "info", title, f"free: {line}", evidence)
