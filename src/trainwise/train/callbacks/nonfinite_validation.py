"""A validation pass that gives NaN (or Inf) is not a result: say so, once, instead of completing quietly.

Validation metrics come back NaN when the validation data holds NaN (inputs, or regression targets) or the
model's outputs on it overflow. Early stopping ignores such evaluations (train/callbacks/early_stop.py), so `best`
comes from finite ones only; this callback records a warning event naming the metrics, the first time they
turn non-finite and again whenever the set of them changes, so the report and `trainwise diagnose` show it.
"""
from __future__ import annotations

import math
from typing import Any

from trainwise.train.callbacks.base import Callback, TrainerView

_NOT_METRICS = frozenset({"split", "step", "epoch", "time"})


def nonfinite_metrics(record: dict[str, Any]) -> list[str]:
    """`val/<name>` of each metric in a validation record that is NaN or ±Inf."""
    return [f"val/{name}" for name, value in record.items() if name not in _NOT_METRICS
            and isinstance(value, float) and not math.isfinite(value)]


class NonFiniteValidation(Callback):
    def __init__(self) -> None:
        self._reported: tuple[str, ...] = ()

    def on_eval(self, trainer: TrainerView, record: dict[str, Any]) -> None:
        names = tuple(nonfinite_metrics(record))
        if not names or names == self._reported:
            self._reported = names
            return
        self._reported = names
        monitor = trainer.config.eval.monitor
        consequence = (f" {monitor} is the monitored metric: this evaluation can be no best, and early stopping "
                       "does not count it.") if monitor in names else ""
        trainer.run_dir.log_event(
            "nonfinite_validation",
            f"validation at step {trainer.step} gave a non-finite {', '.join(names)}: the validation data holds "
            f"NaN or Inf (inputs or targets), or the model's outputs on it overflow.{consequence} Check the "
            "validation split with `trainwise check RECIPE`.",
            severity="warning", step=trainer.step, evidence={"metrics": list(names), "monitor": monitor,
                                                            "values": {n: str(record[n[4:]]) for n in names}})
