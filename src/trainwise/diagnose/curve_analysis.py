"""Every curve finding for one run, convergence first and then fit, and the best step: the analysis the report,
`trainwise diagnose` and the live checks read. The rules are `diagnose.convergence` (flat, diverging,
oscillating) and `diagnose.curves` (overfitting, underfitting, noise, still improving)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from trainwise.diagnose.convergence import convergence_findings
from trainwise.diagnose.curves import best_point, noisy_validation, overfitting, series, still_improving, underfitting
from trainwise.diagnose.task_profile import TaskProfile
from trainwise.findings import Finding


@dataclass(frozen=True)
class CurveAnalysis:
    best: dict[str, Any] | None  # {"metric", "value", "step"} of the monitored val metric
    findings: list[Finding]

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best, "findings": [f.to_dict() for f in self.findings]}


def analyse_curves(records: list[dict[str, Any]], *, monitor: str = "val/loss",
                   mode: Literal["min", "max", "auto"] = "auto", patience: int = 3,
                   early_stopping: bool = False, warmup_steps: int = 0,
                   task: TaskProfile | None = None) -> CurveAnalysis:
    """Every curve finding for one run (convergence and fit). `early_stopping`: whether the run had it on
    (changes the advice); `warmup_steps`: the LR warmup, during which a flat loss is expected; `task`: what
    chance is and how train and validation losses compare (a sampled softmax trains on another loss than
    the full one validation measures: their gap means nothing)."""
    train = [(s, v) for s, v in series(records, "train", "loss") if math.isfinite(v)]
    val = [(s, v) for s, v in series(records, "val", "loss") if math.isfinite(v)]
    convergence = convergence_findings(records, warmup_steps=warmup_steps, task=task)
    comparable = task is None or task.loss != "sampled_softmax"
    fit = [overfitting(train, val, patience=patience, early_stopping=early_stopping) if comparable else None,
           noisy_validation(records, monitor), still_improving(records, monitor, mode)]
    # a flat or diverging loss is not underfitting: that is the finding to act on first. A next-item loss
    # has no scale to call "levelled off too high" by: thousands of items keep it high in a healthy run
    if not convergence and (task is None or task.kind != "next_item"):
        fit.append(underfitting(train, val, perplexity=task is not None and task.kind == "language_model"))
    return CurveAnalysis(best=best_point(records, monitor, mode),
                         findings=convergence + [f for f in fit if f is not None])
