"""A hand-made run directory, shaped like the trainer's output, written through RunDir (no training)."""
from __future__ import annotations

import math
import random

from trainwise.recipes import load_recipe
from trainwise.rundir.layout import RunDir


def make_fake_run(path, *, overfit: bool = True, system: bool = True) -> RunDir:
    """A run directory written by hand through RunDir, shaped like the trainer's output."""
    run = RunDir.create(path, overwrite=True)
    run.write_config(load_recipe("breast-cancer", ["train.max_steps=200"]))
    rng = random.Random(0)
    for step in range(10, 201, 10):
        run.log_metrics({"split": "train", "step": step, "epoch": step / 12, "lr": 1e-3 * (1 - step / 250),
                         "loss": math.exp(-step / 40) + 0.02 * rng.random(), "grad_norm": 1.0,
                         "samples_per_s": 1000 + 50 * rng.random(), "data_wait_fraction": 0.1})
        if step % 20 == 0:
            val_loss = 0.3 + (step - 100) ** 2 / 20000 if overfit else 0.3 + math.exp(-step / 40)
            run.log_metrics({"split": "val", "step": step, "epoch": step / 12, "loss": val_loss,
                             "accuracy": 0.9, "balanced_accuracy": 0.85})
    if system:
        for t in range(5):
            run.log_system({"time": 1000.0 + 2 * t, "cpu_percent": 50.0, "gpus": [
                {"index": 0, "utilization_pct": 90 + t, "temperature_c": 60 + t,
                 "memory_used_bytes": 2 ** 30 * (4 + t), "power_w": 200.0}]})
    run.log_event("thermal", "GPU 0 reached 83 °C", severity="warning", step=120, evidence={"temperature_c": 83})
    run.write_summary({"status": "completed", "steps": 200, "epoch": 16.6,
                       "best": {"metric": "val/loss", "value": 0.3, "step": 100}, "final": {"loss": 0.8},
                       "timings": {"wall_s": 12.0, "samples_per_s": 1000.0}, "device": "cpu",
                       "precision": "fp32"})
    return run
