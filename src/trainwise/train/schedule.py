"""Learning-rate schedule: linear warmup, then cosine, linear or constant decay, per optimizer step."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trainwise.config import ScheduleConfig, warmup_steps

if TYPE_CHECKING:  # the schedule's numbers are pure; readers (report, diagnose) use them without torch
    import torch


def lr_factor(step: int, *, warmup: int, max_steps: int, decay: str, min_ratio: float) -> float:
    """Multiplier of the peak LR for the optimizer step about to run (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    if decay == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    if decay == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape


class WarmupDecay:
    """A picklable-free LR lambda: LambdaLR stores only its numbers in the checkpoint."""

    def __init__(self, schedule: ScheduleConfig, max_steps: int):
        self.warmup = warmup_steps(schedule, max_steps)
        self.max_steps = max_steps
        self.decay = schedule.decay
        self.min_ratio = schedule.min_lr_ratio

    def __call__(self, step: int) -> float:
        return lr_factor(step, warmup=self.warmup, max_steps=self.max_steps, decay=self.decay,
                         min_ratio=self.min_ratio)


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: ScheduleConfig,
                    max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, WarmupDecay(schedule, max_steps))
