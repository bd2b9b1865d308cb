"""Run directories written by hand through RunDir, shaped like the trainer's and the sampler's records,
with one fault injected at a time (or none)."""
from __future__ import annotations

import math
import random
from typing import Any, Callable

from trainwise.recipes import load_recipe
from trainwise.rundir.layout import RunDir

GIB = 2**30
MAX_STEPS = 500


def healthy_loss(step: int) -> float:
    return 0.1 + math.exp(-step / 50)


def healthy_val(step: int) -> float:
    return 0.15 + math.exp(-step / 50)


def make_run(path, *, train_loss: Callable[[int], float] = healthy_loss,
             val_loss: Callable[[int], float] | None = healthy_val,
             grad_norm: Callable[[int], float] = lambda s: 1.0 + 0.1 * math.sin(s),
             lr: Callable[[int], float] = lambda s: 1e-3,
             data_wait: Callable[[int], float] = lambda s: 0.05, train_extra: Callable[[int], dict] | None = None,
             samples: list[dict[str, Any]] | None = None, events: list[dict[str, Any]] = (),
             summary: dict[str, Any] | None = None, overrides: list[str] = (), every: int = 10,
             val_every: int = 50, seed: int = 0) -> RunDir:
    """500 steps of train records every `every` steps (val every `val_every`), then system samples,
    events and the summary. Each curve is a function of the step, with a little noise on the loss."""
    rng = random.Random(seed)
    run = RunDir.create(path, overwrite=True)
    run.write_config(load_recipe("breast-cancer", [f"train.max_steps={MAX_STEPS}", *overrides]))
    for step in range(every, MAX_STEPS + 1, every):
        loss = train_loss(step)
        if math.isfinite(loss):
            loss *= 1 + 0.005 * rng.uniform(-1, 1)
        wait = data_wait(step)
        record = {"split": "train", "step": step, "epoch": step // 12, "loss": loss, "lr": lr(step),
                  "grad_norm": grad_norm(step), "samples_per_s": 3000.0, "step_time_s": 0.01,
                  "data_wait_s": 0.01 * wait, "compute_s": 0.01 * (1 - wait), "data_wait_fraction": wait,
                  "skipped_steps": 0, **(train_extra(step) if train_extra else {})}
        run.log_metrics(record)
        if val_loss is not None and step % val_every == 0:
            run.log_metrics({"split": "val", "step": step, "epoch": step // 12, "loss": val_loss(step),
                             "accuracy": 0.9})
    for sample in samples or []:
        run.log_system(sample)
    for event in events:
        run.log_event(event["kind"], event["message"], severity=event.get("severity", "info"),
                      step=event.get("step"), evidence=event.get("evidence"))
    run.write_summary({"status": "completed", "steps": MAX_STEPS, "max_steps": MAX_STEPS, "device": "cpu",
                       "precision": "fp32", "tf32": False, **(summary or {})})
    return run


def gpu_samples(*, every: int = 10, ram: Callable[[int], float] = lambda s: 8 * GIB,
                gpu: Callable[[int], dict[str, Any]] | None = None, name: str = "NVIDIA A100-SXM4-80GB",
                seed: int = 0) -> list[dict[str, Any]]:
    """Telemetry samples as the sampler writes them (one per `every` steps), for one GPU unless `gpu` is None
    and `name` empty. `gpu(step)` overrides the per-GPU fields."""
    rng = random.Random(seed)
    samples = []
    for i, step in enumerate(range(0, MAX_STEPS + 1, every)):
        card = {"index": 0, "name": name, "utilization_pct": 95.0,
                "memory_used_bytes": 20 * GIB + rng.randint(0, 2**20),
                "memory_total_bytes": 80 * GIB, "temperature_c": 65, "power_w": 300.0, "power_limit_w": 400.0,
                "sm_clock_mhz": 1410, "fan_pct": None, "throttle_reasons": [],
                **(gpu(step) if gpu else {})}
        samples.append({"time": 1000.0 + 2 * i, "step": step, "gpus": [card] if name else [],
                        "cpu_percent": 40.0, "ram_used_bytes": ram(step) + rng.randint(0, 2**20),
                        "ram_total_bytes": 64 * GIB, "ram_percent": 20.0, "disk_read_bytes_per_s": 0.0})
    return samples


def codes(findings) -> list[str]:
    return [f.code for f in findings]


def only(findings, code: str):
    [found] = [f for f in findings if f.code == code]
    return found
