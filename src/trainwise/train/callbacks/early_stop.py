"""Early stopping on a monitored metric; its state lives in checkpoints so it survives resume.

A NaN evaluation (validation data with NaN in it, outputs that overflow) says nothing about progress: it is
never a new best, and it does not count towards `patience` either, so a run whose validation is NaN keeps
training rather than stopping with no best at all (train/callbacks/nonfinite_validation.py logs a warning for it).
"""
from __future__ import annotations

import math
from typing import Any, Literal


class EarlyStopping:
    def __init__(self, mode: Literal["min", "max"], patience: int, min_delta: float = 0.0,
                 enabled: bool = True):
        self.mode = mode
        self.patience = patience
        self.min_delta = min_delta
        self.enabled = enabled
        self.best: float | None = None
        self.best_step: int | None = None
        self.evals_without_improvement = 0

    def improved(self, value: float) -> bool:
        if self.best is None or math.isnan(self.best):
            return not math.isnan(value)
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, value: float, step: int) -> bool:
        """Record an evaluation; True when it is the new best. NaN: neither better nor worse."""
        if math.isnan(value):
            return False
        if self.improved(value):
            self.best, self.best_step = value, step
            self.evals_without_improvement = 0
            return True
        self.evals_without_improvement += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.enabled and self.evals_without_improvement >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step,
                "evals_without_improvement": self.evals_without_improvement}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        self.best_step = state["best_step"]
        self.evals_without_improvement = state["evals_without_improvement"]
