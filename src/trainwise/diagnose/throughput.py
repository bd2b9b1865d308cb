"""Why training is slow: data-starved, not on the GPU while one exists, fp32 on a card with tensor cores,
batches so small the step is launch-bound, unpinned host-to-device copies.

Pure functions over the engine's data-wait/compute split (train records of metrics.jsonl), the telemetry
samples of system.jsonl, summary.json (device, precision, tf32) and the resolved config. The starvation
thresholds are telemetry's (`telemetry.starvation_*`, judged by `alerts.is_starved`), so the live alert and
this diagnosis agree.
"""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from trainwise.config import RunConfig, TelemetryConfig
from trainwise.findings import Finding
from trainwise.diagnose.hardware import gpus_of
from trainwise.telemetry.alerts import STARVED_LOGS_IN_A_ROW, is_starved

# Batches up to this size leave a GPU idle between kernel launches: each step is a few microseconds of work
# per kernel against ~10 µs of launch overhead.
TINY_BATCH = 16
# A collapse: at least this many last logs below this share of the run's earlier median rate. Healthy
# runs vary by tens of percent between logs (evaluation, checkpoints); a fall to a fifth is something else.
COLLAPSE_LOGS = 3
COLLAPSE_FACTOR = 0.2
COLLAPSE_MIN_S = 60.0  # and the slow spell lasted this long: a second of slow logs in a tiny run costs nothing
BUSY_CPU_PERCENT = 90.0  # psutil's all-core average: near 100 means no core is free
# NVIDIA cards with tensor cores (Volta and newer, and the Turing RTX line); GTX 16xx and older have none.
TENSOR_CORE_NAMES = re.compile(r"\b(V100|T4|A\d{1,3}|H\d{2,3}|GH\d{3}|B\d{3}|GB\d{3}|L4|L40S?|RTX|TITAN V|TITAN RTX)\b",
                               re.IGNORECASE)


def throughput_findings(records: list[dict[str, Any]], system: list[dict[str, Any]], *,
                        config: RunConfig | None = None, summary: dict[str, Any] | None = None) -> list[Finding]:
    summary = summary or {}
    settings = config.telemetry if config is not None else TelemetryConfig()
    train = [r for r in records if r.get("split") == "train" and isinstance(r.get("step"), int)]
    device = str(summary.get("device") or (config.train.device if config else "") or "")
    found = [data_starved(train, system, settings, config), not_on_gpu(train, system, device, config),
             fp32_on_tensor_cores(train, system, device, summary),
             tiny_batches(train, system, device, settings, config),
             unpinned_copies(train, device, config), throughput_collapse(train, system)]
    return [f for f in found if f is not None]


def throughput_collapse(train: list[dict[str, Any]], system: list[dict[str, Any]]) -> Finding | None:
    """The step rate fell to a fraction of what the run did before and stayed there (6,000 -> 200 samples/s):
    something took the machine (another process on the cores, swapping, a throttled or shared GPU). The
    host CPU's load since then says whether the cores were the contended part."""
    rates = [(r["step"], float(r["samples_per_s"]), r.get("time")) for r in train[1:]  # the first: start-up
             if _number(r.get("samples_per_s")) and r["samples_per_s"] > 0]
    if len(rates) < 2 * COLLAPSE_LOGS:
        return None
    tail = 0  # logs at the end of the run that all ran below a fraction of the rate before them
    while tail < len(rates) - COLLAPSE_LOGS and rates[-tail - 1][1] < COLLAPSE_FACTOR * float(
            np.median([v for _, v, _ in rates[:len(rates) - tail - 1]])):
        tail += 1
    if tail < COLLAPSE_LOGS:
        return None
    since, last = rates[-tail][2], rates[-1][2]
    if not (_number(since) and _number(last) and last - since >= COLLAPSE_MIN_S):
        return None
    before = float(np.median([v for _, v, _ in rates[:-tail]]))
    after = float(np.median([v for _, v, _ in rates[-tail:]]))
    step, _, since = rates[-tail]
    cpu = [float(x["cpu_percent"]) for x in system if _number(x.get("cpu_percent"))
           and _number(x.get("time")) and _number(since) and x["time"] >= since]
    busy = float(np.median(cpu)) if cpu else None
    host = (f"; the host CPU has been {busy:.0f}% busy since (median of {len(cpu)} samples): the cores are "
            "contended" if busy is not None and busy >= BUSY_CPU_PERCENT else
            f"; the host CPU has been {busy:.0f}% busy since" if busy is not None else "")
    return Finding(
        "throughput_collapse", "warn", f"throughput collapsed at step {step}: {before:,.0f} -> {after:,.0f} "
        "samples/s", f"Training ran at a median {before:,.0f} samples/s, then from step {step} at {after:,.0f} "
        f"for the last {tail} logs{host}.",
        {"samples_per_s_before": before, "samples_per_s_after": after, "since_step": step, "logs_after": tail,
         "host_cpu_percent": busy, "rule": f"≥ {COLLAPSE_LOGS} last logs below {COLLAPSE_FACTOR:g} × the median "
                                          "rate before them"},
        ("See what else runs on the machine: `top` (or `htop`) sorted by CPU; other jobs, a stuck DataLoader "
         "worker, or swapping (`free -h`).",
         "Pin the run to free cores or give it fewer data.num_workers than cores, so the loader and the step "
         "do not compete.", "On a shared GPU, `nvidia-smi` shows other processes and clocks (thermal or power "
         "throttling)."), step=step)


def data_starved(train: list[dict[str, Any]], system: list[dict[str, Any]], settings: TelemetryConfig,
                 config: RunConfig | None) -> Finding | None:
    """The step waits on data most of the time while the GPU idles (with no GPU, the wait alone decides)."""
    # the first log window includes worker start-up: one high reading proves nothing
    timed = [r for r in train[1:] if _number(r.get("data_wait_fraction"))]
    if len(timed) < STARVED_LOGS_IN_A_ROW:
        return None
    wait = float(np.median([r["data_wait_fraction"] for r in timed]))
    utilization = _gpu_utilization(system)
    if not is_starved(wait, [utilization] if utilization is not None else [], settings):
        return None
    first = next(r for r in timed if r["data_wait_fraction"] > settings.starvation_wait_above)
    workers = config.data.num_workers if config else None
    evidence = {"data_wait_fraction": wait, "data_wait_s": _median(timed, "data_wait_s"),
                "compute_s": _median(timed, "compute_s"), "samples_per_s": _median(timed, "samples_per_s"),
                "gpu_utilization_pct": utilization, "num_workers": workers,
                "pin_memory": config.data.pin_memory if config else None, "logs": len(timed),
                "rule": f"median data wait > {settings.starvation_wait_above:.0%} of step time"
                        + (f" and GPU utilisation < {settings.starvation_util_below:g}%" if utilization is not None
                           else " (no GPU samples)")}
    util = f" while the GPU was {utilization:.0f}% busy" if utilization is not None else ""
    bench = f"`trainwise data bench {config.data.path}`" if config and config.data.path else \
        "`trainwise data bench DIR` on the prepared data (`trainwise prepare` makes it)"
    return Finding(
        "data_starved", "warn", f"data-starved: {wait:.0%} of step time waits for data",
        f"From step {first['step']} the training step spent a median {wait:.0%} of its time waiting for the next "
        f"batch ({_s(evidence['data_wait_s'])} waiting vs {_s(evidence['compute_s'])} computing per step){util}. "
        f"The loader runs {workers if workers is not None else 'an unknown number of'} worker(s).", evidence,
        ("Raise data.num_workers (try data.num_workers=auto, or the core count).",
         f"Measure which worker count keeps up: {bench}.",
         "Prepare the data into shards once (`trainwise prepare`) and lighten the augmentation.",
         "Pin host memory on a GPU: data.pin_memory=true."), step=first["step"])


def not_on_gpu(train: list[dict[str, Any]], system: list[dict[str, Any]], device: str,
               config: RunConfig | None) -> Finding | None:
    gpus = _gpu_names(system)
    if not gpus or not train or not device.startswith("cpu"):
        return None
    requested = config.train.device if config else None
    return Finding(
        "not_on_gpu", "warn", f"trained on the CPU while {len(gpus)} GPU(s) were present",
        f"The run trained on {device} although telemetry saw {', '.join(gpus)}; train.device was {requested!r}.",
        {"device": device, "train_device": requested, "gpus": gpus, "samples_per_s": _median(train, "samples_per_s")},
        ("Set train.device=auto (or cuda).",
         "If auto still picks the CPU, check the PyTorch build sees CUDA: `trainwise doctor`."),
        step=train[0]["step"])


def fp32_on_tensor_cores(train: list[dict[str, Any]], system: list[dict[str, Any]], device: str,
                         summary: dict[str, Any]) -> Finding | None:
    precision = summary.get("precision")
    tensor_core_cards = [n for n in _gpu_names(system) if TENSOR_CORE_NAMES.search(n)]
    if precision != "fp32" or not device.startswith("cuda") or not tensor_core_cards or not train:
        return None
    tf32 = bool(summary.get("tf32"))
    return Finding(
        "fp32_on_tensor_cores", "info" if tf32 else "warn",
        f"fp32 training on {tensor_core_cards[0]}, which has tensor cores",
        f"The run computed in fp32{' (with TF32 matmuls)' if tf32 else ''} on {tensor_core_cards[0]}; bf16 or fp16 "
        "runs the matrix maths on its tensor cores, typically 2-8× faster, and halves activation memory.",
        {"precision": precision, "tf32": tf32, "gpus": tensor_core_cards, "device": device,
         "samples_per_s": _median(train, "samples_per_s")},
        ("Set train.precision=auto (bf16 where the card has it) or train.precision=bf16.",
         "On cards without bf16 (V100, T4), train.precision=fp16 with its loss scaling."),
        step=train[0]["step"])


def tiny_batches(train: list[dict[str, Any]], system: list[dict[str, Any]], device: str,
                 settings: TelemetryConfig, config: RunConfig | None) -> Finding | None:
    """Small batches on a GPU that is mostly idle though the data keeps up: the step is launch-bound."""
    if config is None or not device.startswith("cuda") or config.train.batch_size > TINY_BATCH or len(train) < 2:
        return None
    utilization = _gpu_utilization(system)
    wait = _median(train[1:], "data_wait_fraction")
    if utilization is None or utilization >= settings.starvation_util_below or \
            (wait is not None and wait > settings.starvation_wait_above):
        return None
    batch = config.train.batch_size
    return Finding(
        "tiny_batches", "warn", f"batch size {batch} leaves the GPU {100 - utilization:.0f}% idle",
        f"With batches of {batch} the GPU was {utilization:.0f}% busy though the data kept up (median data wait "
        f"{wait if wait is not None else 0:.0%}); each step is too little work to cover its kernel launches.",
        {"batch_size": batch, "gpu_utilization_pct": utilization, "data_wait_fraction": wait,
         "step_time_s": _median(train, "step_time_s"), "samples_per_s": _median(train, "samples_per_s"),
         "rule": f"batch ≤ {TINY_BATCH} and GPU utilisation < {settings.starvation_util_below:g}%"},
        (f"Raise train.batch_size (try {batch * 4}) and scale optim.lr with it.",
         "Try model.compile=true: fewer, fused kernels per step."), step=train[0]["step"])


def unpinned_copies(train: list[dict[str, Any]], device: str, config: RunConfig | None) -> Finding | None:
    if config is None or config.data.pin_memory is not False or not device.startswith("cuda") or not train:
        return None
    return Finding(
        "unpinned_copies", "info", "host-to-device copies from unpinned memory",
        "data.pin_memory is false on a CUDA run: every batch is copied through a staging buffer and the copy "
        "cannot overlap compute.",
        {"pin_memory": False, "device": device, "data_wait_fraction": _median(train[1:], "data_wait_fraction")},
        ("Set data.pin_memory=auto (or true).",), step=train[0]["step"])


def _gpu_utilization(system: list[dict[str, Any]]) -> float | None:
    """Mean utilisation over every GPU sample; None without GPU samples."""
    values = [g["utilization_pct"] for s in system for g in gpus_of(s) if _number(g.get("utilization_pct"))]
    return float(np.mean(values)) if values else None


def _gpu_names(system: list[dict[str, Any]]) -> list[str]:
    names: dict[Any, str] = {}
    for sample in system:
        for g in gpus_of(sample):
            names.setdefault(g.get("index"), str(g.get("name") or f"GPU {g.get('index')}"))
    return list(names.values())


def _median(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if _number(r.get(key))]
    return float(np.median(values)) if values else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _s(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.1f} ms"
