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
    return decay_factor(min(1.0, (step - warmup) / max(1, max_steps - warmup)), decay, min_ratio)


def decay_factor(progress: float, decay: str, min_ratio: float) -> float:
    """The multiplier `progress` (0..1) of the way through the decay."""
    if decay == "constant":
        return 1.0
    shape = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape


class WarmupDecay:
    """A picklable-free LR lambda: LambdaLR stores only its numbers in the checkpoint.

    A resume that changes the run's length (`--allow-config-change train.max_steps=...`) re-fits the rest of
    the decay rather than re-shaping it: from the step it resumes at, the decay goes on from the progress it
    had reached there to its end at the new last step, so the LR continues from its value, without a jump.
    `segments` are [first step, last step] of each length the run had; warmup keeps its first length."""

    def __init__(self, schedule: ScheduleConfig, max_steps: int):
        self.warmup = warmup_steps(schedule, max_steps)
        self.max_steps = max_steps
        self.decay = schedule.decay
        self.min_ratio = schedule.min_lr_ratio
        self.segments: list[list[int]] = [[0, max_steps]]

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        return decay_factor(self.progress(step), self.decay, self.min_ratio)

    def progress(self, step: int) -> float:
        """How far through the decay `step` is, 0..1: each segment goes on from the progress the one before
        reached at its first step, to 1 at its last step."""
        done = 0.0
        for (start, end), following in zip(self.segments, [*self.segments[1:], None]):
            begin = max(start, self.warmup)
            until = step if following is None or step < following[0] else following[0]
            done = min(1.0, done + (1.0 - done) * max(0, until - begin) / max(1, end - begin))
            if until == step:
                return done
        return done

    def continue_from(self, saved: dict, step: int) -> bool:
        """Take the schedule a checkpoint saved (its lambda's numbers) and continue it at `step` to this run's
        length; True when the length changed and the rest of the decay was re-fitted."""
        if not isinstance(saved, dict) or not isinstance(saved.get("max_steps"), int):
            return False  # no numbers saved: the config's schedule as it is
        self.warmup = int(saved.get("warmup", self.warmup))
        self.segments = [list(s) for s in saved.get("segments") or [[0, saved["max_steps"]]]]
        if self.segments[-1][1] == self.max_steps:
            return False
        self.segments.append([step, self.max_steps])
        return True


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: ScheduleConfig,
                    max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, WarmupDecay(schedule, max_steps))


def continue_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, saved: dict, step: int) -> None:
    """Restore a checkpoint's scheduler state at `step` (its position and the schedule's segments), with the
    run's current length: a changed length re-fits the rest of the decay (WarmupDecay.continue_from)."""
    lambdas = saved.get("lr_lambdas") or []
    scheduler.load_state_dict({**saved, "lr_lambdas": [None] * len(lambdas)})
    for function, numbers in zip(scheduler.lr_lambdas, lambdas):
        if isinstance(function, WarmupDecay):
            function.continue_from(numbers, step)
