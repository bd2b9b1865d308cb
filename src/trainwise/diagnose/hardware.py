"""The GPU as hardware during the run: temperature, clock throttling, memory (ECC) errors and Xid faults.

Pure over system.jsonl samples and events.jsonl. Temperature and throttling are judged by telemetry's
`temperature_level` and `throttle_level` (the product's one owner of those thresholds, `telemetry.*` in
the config), so a card the live alerts and `trainwise doctor` pass is not flagged here. Fixes go software
first: driver and firmware, then airflow, then the vendor.
"""
from __future__ import annotations

import math
import re
from typing import Any

from trainwise.config import TelemetryConfig
from trainwise.findings import Finding
from trainwise.telemetry.alerts import temperature_level, throttle_level

SEVERITY = {"warning": "warn", "error": "error", "info": "info"}  # telemetry's words -> the Finding's
# sample fields and event kinds that count memory errors or driver faults of a card
ERROR_FIELDS = ("ecc_uncorrected_volatile", "ecc_uncorrected", "xid", "xid_errors")
FAULT_EVENT = re.compile(r"(?<![a-z])(xid|ecc)(?![a-z])", re.IGNORECASE)  # "Xid 79", "ecc_xid_hardware"

DRIVER_FIRST = "Update the NVIDIA driver and the card's firmware/VBIOS first: fan curves, thermal limits and " \
               "many faults are fixed there (`nvidia-smi -q | grep -i -e version -e vbios`)."
AIRFLOW = "Then the cooling: airflow and fan speed, dust, blanking panels, inlet temperature, a neighbour card " \
          "blowing hot air into this one."
VENDOR = "If it persists on a current driver with good airflow, it is the card: contact the vendor (RMA)."


def hardware_findings(system: list[dict[str, Any]], events: list[dict[str, Any]], *,
                      settings: TelemetryConfig | None = None) -> list[Finding]:
    settings = settings or TelemetryConfig()
    per_gpu: dict[Any, list[tuple[int | None, dict[str, Any]]]] = {}
    for sample in system:
        for gpu in gpus_of(sample):
            per_gpu.setdefault(gpu.get("index"), []).append((_step(sample.get("step")), gpu))
    found: list[Finding | None] = []
    for index, readings in per_gpu.items():
        found += [gpu_temperature(index, readings, settings), gpu_throttle(index, readings)]
    found.append(gpu_faults(per_gpu, events))
    return [f for f in found if f is not None]


def gpu_temperature(index: Any, readings: list[tuple[int | None, dict[str, Any]]],
                    settings: TelemetryConfig) -> Finding | None:
    temps = [(step, gpu) for step, gpu in readings if _number(gpu.get("temperature_c"))]
    if not temps:
        return None
    hottest_step, hottest = max(temps, key=lambda r: r[1]["temperature_c"])
    peak = hottest["temperature_c"]
    level = temperature_level(peak, settings)
    if level is None:
        return None
    threshold = settings.temperature_fail_c if level == "error" else settings.temperature_warn_c
    hot = [(step, gpu) for step, gpu in temps if gpu["temperature_c"] >= settings.temperature_warn_c]
    first_step = next((step for step, _ in hot if step is not None), hottest_step)
    name = hottest.get("name") or f"GPU {index}"
    return Finding(
        "gpu_temperature", SEVERITY[level], f"GPU {index} reached {peak:g} °C (≥ {threshold:g} °C)",
        f"{name} was at or above {settings.temperature_warn_c:g} °C in {len(hot)} of {len(temps)} samples, from "
        f"step {first_step}; it peaked at {peak:g} °C at step {hottest_step}"
        + (f" with the fan at {hottest['fan_pct']}%" if hottest.get("fan_pct") is not None else "")
        + ". A hot card slows its clocks and, sustained, shortens its life.",
        {"gpu": index, "name": hottest.get("name"), "max_temperature_c": peak, "max_step": hottest_step,
         "first_hot_step": first_step, "hot_samples": len(hot), "samples": len(temps), "threshold_c": threshold,
         "warn_c": settings.temperature_warn_c, "fail_c": settings.temperature_fail_c,
         "fan_pct": hottest.get("fan_pct"), "utilization_pct": hottest.get("utilization_pct")},
        (DRIVER_FIRST, AIRFLOW, VENDOR), step=first_step)


def gpu_throttle(index: Any, readings: list[tuple[int | None, dict[str, Any]]]) -> Finding | None:
    """Clock throttling that costs speed (telemetry's judgement); a power cap under load is normal."""
    judged = [(step, gpu, throttle_level([r for r in gpu["throttle_reasons"] if isinstance(r, str)],
                                         gpu["utilization_pct"] if _number(gpu.get("utilization_pct")) else None))
              for step, gpu in readings if isinstance(gpu.get("throttle_reasons"), list)]
    costly = [(step, gpu, level) for step, gpu, level in judged if level is not None and level[0] != "info"]
    if not costly:
        return None
    rank = {"warning": 1, "error": 2}
    worst = max(costly, key=lambda r: rank[r[2][0]])
    reasons = sorted({reason for _, _, level in costly for reason in level[1]})
    first_step = next((step for step, _, _ in costly if step is not None), None)
    clocks = [gpu["sm_clock_mhz"] for _, gpu, _ in costly if _number(gpu.get("sm_clock_mhz"))]
    return Finding(
        "gpu_throttle", SEVERITY[worst[2][0]], f"GPU {index} clocks throttled: {', '.join(reasons)}",
        f"In {len(costly)} of {len(readings)} samples, from step {first_step}, the card slowed its clocks for "
        f"{', '.join(reasons)}" + (f" (SM clock down to {min(clocks):g} MHz)" if clocks else "") +
        ". Hardware slowdown means overheating or a power supply that cannot deliver.",
        {"gpu": index, "reasons": reasons, "throttled_samples": len(costly), "samples": len(readings),
         "first_step": first_step, "min_sm_clock_mhz": min(clocks) if clocks else None,
         "temperature_c": worst[1].get("temperature_c"), "power_w": worst[1].get("power_w")},
        (DRIVER_FIRST, AIRFLOW + " For power: check the card's power cables and the PSU's rating.", VENDOR),
        step=first_step)


def gpu_faults(per_gpu: dict[Any, list[tuple[int | None, dict[str, Any]]]],
               events: list[dict[str, Any]]) -> Finding | None:
    """Uncorrectable ECC errors or Xid faults, from the samples' counters or the run's events."""
    counted = [(index, step, field, gpu[field]) for index, readings in per_gpu.items() for step, gpu in readings
               for field in ERROR_FIELDS if _number(gpu.get(field)) and gpu[field] > 0]
    logged = [e for e in events if FAULT_EVENT.search(f"{e.get('kind', '')} {e.get('message', '')}")]
    if not counted and not logged:
        return None
    steps = [step for _, step, _, _ in counted if step is not None] + \
            [e["step"] for e in logged if isinstance(e.get("step"), int)]
    first_step = min(steps) if steps else None
    gpus = sorted({str(index) for index, _, _, _ in counted})
    return Finding(
        "gpu_memory_errors", "error", "GPU memory errors or driver faults (ECC/Xid) during the run",
        f"{len(counted)} sample(s) counted errors ({', '.join(sorted({f for _, _, f, _ in counted})) or 'none'})"
        f" on GPU {', '.join(gpus) or '?'}, and {len(logged)} event(s) named ECC or Xid, first at step "
        f"{first_step}. Results computed on such a card cannot be trusted.",
        {"counters": [{"gpu": i, "step": s, "field": f, "value": v} for i, s, f, v in counted[:10]],
         "events": [{"step": e.get("step"), "kind": e.get("kind"), "message": e.get("message")} for e in logged[:10]],
         "first_step": first_step},
        ("Read the driver's log: `sudo dmesg -T | grep -i xid` and `nvidia-smi -q -d ECC`; Xid 13/31/43 are "
         "usually the program, 48/63/64/79/94/95 the card.", DRIVER_FIRST,
         "Reset the card (`nvidia-smi -r`, or reboot) and rerun from the last checkpoint.", VENDOR),
        step=first_step)


def gpus_of(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-GPU readings of a telemetry sample; none when the field is missing or not a list of objects
    (a hand-edited or foreign system.jsonl must not crash a diagnosis)."""
    gpus = sample.get("gpus")
    return [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []


def _step(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
