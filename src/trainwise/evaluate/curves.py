"""What the training curves say: the best step, overfitting, underfitting, divergence, noisy validation.

Pure functions over metrics.jsonl records (RunDir.read_metrics()). Each finding carries the numbers it was
decided on and what to do about it; the diagnose stage reuses these. Thresholds are module constants so a
finding can quote the rule that fired.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from trainwise.config import metric_mode

OVERFIT_RISE = 0.02  # val loss this far (relative) above its best
UNDERFIT_KEPT = 0.7  # train loss still above this share of its start...
FLAT_CHANGE = 0.05  # ...and changing less than this (relative) over the second half
DIVERGE_FACTOR = 1.5  # train loss back above its start and this many times its minimum
NOISE_FLIPS = 0.5  # share of evaluations where the val curve changes direction
NOISE_TO_SIGNAL = 0.25  # jitter of the val curve relative to the improvement it made


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: Literal["info", "warning", "error"]
    message: str
    recommendation: str
    evidence: dict[str, Any] = field(default_factory=dict)
    step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CurveAnalysis:
    best: dict[str, Any] | None  # {"metric", "value", "step"} of the monitored val metric
    findings: list[Finding]

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best, "findings": [f.to_dict() for f in self.findings]}


def series(records: list[dict[str, Any]], split: str, key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric of one split, in step order; missing values left out."""
    points = [(int(r["step"]), float(r[key])) for r in records
              if r.get("split") == split and isinstance(r.get(key), (int, float)) and "step" in r]
    return sorted(points)


def best_point(records: list[dict[str, Any]], monitor: str = "val/loss",
               mode: Literal["min", "max", "auto"] = "auto") -> dict[str, Any] | None:
    split, _, key = monitor.rpartition("/")
    points = [(s, v) for s, v in series(records, split or "val", key) if math.isfinite(v)]
    if not points:
        return None
    mode = metric_mode(monitor) if mode == "auto" else mode
    pick = min if mode == "min" else max
    step, value = pick(points, key=lambda p: p[1])  # the first of equal values: the earliest step
    return {"metric": monitor, "value": value, "step": step}


def analyse_curves(records: list[dict[str, Any]], *, monitor: str = "val/loss",
                   mode: Literal["min", "max", "auto"] = "auto", patience: int = 3,
                   early_stopping: bool = False) -> CurveAnalysis:
    """Every curve finding for one run. `early_stopping`: whether the run had it on (changes the advice)."""
    train = series(records, "train", "loss")
    val = series(records, "val", "loss")
    findings = [f for f in (
        divergence(records, train),
        overfitting(train, val, patience=patience, early_stopping=early_stopping),
        underfitting(train, val),
        noisy_validation(records, monitor),
        still_improving(records, monitor, mode),
    ) if f is not None]
    return CurveAnalysis(best=best_point(records, monitor, mode), findings=findings)


def divergence(records: list[dict[str, Any]], train: list[tuple[int, float]]) -> Finding | None:
    """A non-finite train loss, or a loss that fell and then climbed back above where it started."""
    for r in records:
        loss = r.get("loss")
        if r.get("split") == "train" and isinstance(loss, float) and not math.isfinite(loss):
            return Finding("divergence", "error", f"train loss became {loss} at step {r['step']}.",
                           "Lower optim.lr (try a third), add warmup (schedule.warmup_steps) and keep "
                           "train.grad_clip_norm on; in fp16, try bf16.",
                           {"step": r["step"], "loss": loss, "lr": r.get("lr")}, step=r["step"])
    if len(train) < 4:
        return None
    steps = [s for s, _ in train]
    smooth = _rolling_median([v for _, v in train])
    low = int(np.argmin(smooth))
    first, minimum, last = smooth[0], smooth[low], smooth[-1]
    if last > first and last > DIVERGE_FACTOR * minimum:
        turn = next(i for i in range(low, len(smooth)) if smooth[i] > DIVERGE_FACTOR * minimum)
        lr = next((r.get("lr") for r in records if r.get("split") == "train" and r.get("step") == steps[turn]),
                  None)
        return Finding(
            "divergence", "error",
            f"train loss fell to {minimum:.4g} at step {steps[low]}, then climbed to {last:.4g} by step "
            f"{steps[-1]}, above its start ({first:.4g}).",
            "Training diverged: lower optim.lr (try a third)" + (f" from {lr:.3g}" if lr else "") +
            ", lengthen the warmup, keep train.grad_clip_norm on; resume from a checkpoint before step "
            f"{steps[turn]}.",
            {"start_loss": first, "min_loss": minimum, "min_step": steps[low], "last_loss": last,
             "turn_step": steps[turn], "lr_at_turn": lr}, step=steps[turn])
    return None


def overfitting(train: list[tuple[int, float]], val: list[tuple[int, float]], *, patience: int = 3,
                early_stopping: bool = False) -> Finding | None:
    """Val loss rising for `patience` evaluations past its best while train loss keeps falling."""
    if len(val) < patience + 1 or not train:
        return None
    values = [v for _, v in val]
    best = int(np.argmin(values))
    evals_since = len(val) - 1 - best
    best_step, best_loss = val[best]
    last_step, last_loss = val[-1]
    if evals_since < patience or last_loss <= best_loss * (1 + OVERFIT_RISE):
        return None
    train_at_best, train_at_end = _train_loss_near(train, best_step), _train_loss_near(train, last_step)
    gap_at_best, gap_at_end = best_loss - train_at_best, last_loss - train_at_end
    if not (train_at_end < train_at_best and gap_at_end > gap_at_best):
        return None
    evidence = {"best_step": best_step, "best_val_loss": best_loss, "last_step": last_step,
                "last_val_loss": last_loss, "evals_since_best": evals_since, "train_loss_at_best": train_at_best,
                "train_loss_at_end": train_at_end, "gap_at_best": gap_at_best, "gap_at_end": gap_at_end}
    message = (f"overfitting: val loss rose from {best_loss:.4g} (step {best_step}) to {last_loss:.4g} "
               f"(step {last_step}) over {evals_since} evaluations while train loss fell from "
               f"{train_at_best:.4g} to {train_at_end:.4g}; val minus train loss went from "
               f"{gap_at_best:.3g} to {gap_at_end:.3g}.")
    if early_stopping:
        return Finding("overfitting", "info", message + " Early stopping caught it.",
                       f"Use the weights of step {best_step} (checkpoint `best`). To push the best point "
                       "later: more regularisation (optim.weight_decay, model.args.dropout, data.augment) "
                       "or more data.", evidence, step=best_step)
    return Finding("overfitting", "warning", message,
                   f"Stop at step {best_step}: eval.early_stopping.enabled=true (patience {patience}) keeps "
                   "those weights. Then regularise (optim.weight_decay, model.args.dropout, data.augment=true) "
                   "or add training data.", evidence, step=best_step)


def underfitting(train: list[tuple[int, float]], val: list[tuple[int, float]]) -> Finding | None:
    """Train loss that stays near its start and has gone flat: the model is not fitting even the train set."""
    if len(train) < 6:
        return None
    values = [v for _, v in train]
    start = float(np.mean(values[:2]))
    end = float(np.mean(values[-2:]))
    half = values[len(values) // 2]
    if start <= 0 or not math.isfinite(end):
        return None
    kept = end / start
    recent_change = (half - end) / half if half > 0 else 0.0
    if kept < UNDERFIT_KEPT or recent_change > FLAT_CHANGE:
        return None
    val_end = val[-1][1] if val else None
    return Finding(
        "underfitting", "warning",
        f"train loss went from {start:.4g} to only {end:.4g} ({kept:.0%} of its start) and changed "
        f"{recent_change:.1%} over the second half" +
        (f"; val loss ends at {val_end:.4g}, as high." if val_end is not None else "."),
        "The model is not fitting the training data: raise optim.lr (try ×3), train longer "
        "(train.max_steps), use a bigger model (model.args), or lower the regularisation "
        "(optim.weight_decay, model.args.dropout, train.label_smoothing).",
        {"start_train_loss": start, "end_train_loss": end, "share_kept": kept,
         "second_half_change": recent_change, "end_val_loss": val_end, "rule": f"kept > {UNDERFIT_KEPT} and "
         f"second-half change < {FLAT_CHANGE}"}, step=train[-1][0])


def noisy_validation(records: list[dict[str, Any]], monitor: str = "val/loss") -> Finding | None:
    """A val curve that zig-zags by more than a quarter of the improvement it shows."""
    split, _, key = monitor.rpartition("/")
    points = series(records, split or "val", key)
    if len(points) < 5:
        return None
    values = np.array([v for _, v in points])
    diffs = np.diff(values)
    flips = int((diffs[:-1] * diffs[1:] < 0).sum())
    flip_share = flips / (len(diffs) - 1)
    jitter = float(np.abs(values[1:-1] - (values[:-2] + values[2:]) / 2).mean())
    improvement = float(abs(values[0] - (values.min() if metric_mode(monitor) == "min" else values.max())))
    if flip_share < NOISE_FLIPS or jitter <= NOISE_TO_SIGNAL * max(improvement, 1e-12):
        return None
    return Finding(
        "noisy_validation", "warning",
        f"{monitor} changes direction at {flips} of {len(diffs) - 1} evaluations; it jitters by "
        f"{jitter:.3g} against an overall improvement of {improvement:.3g}. A best step picked on it is "
        "partly luck.",
        f"Enlarge the validation split (data.val_fraction), set eval.early_stopping.min_delta to about "
        f"{jitter:.2g} with more patience, and compare variants over several seeds "
        "(`trainwise ablate --seeds 3`).",
        {"evaluations": len(points), "direction_changes": flips, "jitter": jitter,
         "improvement": improvement}, step=points[-1][0])


def still_improving(records: list[dict[str, Any]], monitor: str = "val/loss",
                    mode: Literal["min", "max", "auto"] = "auto") -> Finding | None:
    """The monitored metric was still getting better at the last evaluations: the run ended early."""
    split, _, key = monitor.rpartition("/")
    points = series(records, split or "val", key)
    if len(points) < 3:
        return None
    sign = -1.0 if (metric_mode(monitor) if mode == "auto" else mode) == "min" else 1.0
    last = [v for _, v in points[-3:]]
    gains = [sign * (b - a) / max(abs(a), 1e-12) for a, b in zip(last, last[1:])]
    if min(gains) <= 0.005:
        return None
    return Finding(
        "still_improving", "info",
        f"{monitor} improved at each of the last evaluations ({', '.join(f'{v:.4g}' for v in last)}); "
        "training stopped before it levelled off.",
        "Train longer (raise train.max_steps) and let early stopping pick the end.",
        {"last_values": last, "relative_gains": gains}, step=points[-1][0])


def _rolling_median(values: list[float], width: int = 3) -> list[float]:
    """Smooth single-batch spikes without shifting the curve."""
    half = width // 2
    return [float(np.median(values[max(0, i - half): i + half + 1])) for i in range(len(values))]


def _train_loss_near(train: list[tuple[int, float]], step: int, window: int = 3) -> float:
    """Mean of the last few train losses logged at or before `step` (train losses are per-batch noisy)."""
    before = [v for s, v in train if s <= step] or [train[0][1]]
    return float(np.mean(before[-window:]))
