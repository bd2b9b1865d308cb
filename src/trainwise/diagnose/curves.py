"""What the loss curves say about fit: the best step, overfitting, underfitting, noisy validation, a run that
ended while still improving. Convergence (flat, diverging, oscillating) is `diagnose.convergence`.

Pure functions over metrics.jsonl records (RunDir.read_metrics()). Every finding names its step and the
numbers it was decided on. Thresholds are module constants so a finding can quote the rule that fired.
"""
from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from trainwise.config import metric_mode
from trainwise.findings import Finding

# Val loss this far (relative) above its best before "rising" is more than evaluation noise.
OVERFIT_RISE = 0.02
# Underfitting: train loss still above this share of where it started (it fell, but not far)...
UNDERFIT_KEPT = 0.7
# ...and changing less than this (relative) over the second half: it has stopped improving, not just slow.
PLATEAU_CHANGE = 0.05
# Noisy validation: the val curve changes direction at this share of evaluations...
NOISE_FLIPS = 0.5
# ...and its jitter is more than this share of the improvement it made: the best step is partly luck.
NOISE_TO_SIGNAL = 0.25
# The monitored metric improved by more than this (relative) at each of the last evaluations.
STILL_IMPROVING_GAIN = 0.005

Points = list[tuple[int, float]]


def series(records: list[dict[str, Any]], split: str, key: str) -> Points:
    """(step, value) pairs of one metric of one split, in step order; missing values left out."""
    points = [(int(r["step"]), float(r[key])) for r in records
              if r.get("split") == split and isinstance(r.get(key), (int, float))
              and not isinstance(r.get(key), bool) and isinstance(r.get("step"), int)]
    return sorted(points)


def value_at(records: list[dict[str, Any]], split: str, key: str, step: int) -> float | None:
    """The value of `key` in the last `split` record logged at or before `step` (the LR in force, say)."""
    before = [(s, v) for s, v in series(records, split, key) if s <= step]
    return before[-1][1] if before else None


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


def overfitting(train: Points, val: Points, *, patience: int = 3, early_stopping: bool = False) -> Finding | None:
    """Val loss rising for `patience` evaluations past its best while train loss keeps falling."""
    if len(val) < patience + 1 or not train:
        return None
    best = int(np.argmin([v for _, v in val]))
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
                "train_loss_at_end": train_at_end, "gap_at_best": gap_at_best, "gap_at_end": gap_at_end,
                "rule": f"val loss > {1 + OVERFIT_RISE:g} × its best for ≥ {patience} evaluations, train loss "
                        "falling"}
    detail = (f"Val loss turned at step {best_step} ({best_loss:.4g}) and rose to {last_loss:.4g} by step "
              f"{last_step} over {evals_since} evaluations, while train loss kept falling from "
              f"{train_at_best:.4g} to {train_at_end:.4g}; val minus train loss went from {gap_at_best:.3g} to "
              f"{gap_at_end:.3g}. The model is memorising the training set.")
    regularise = ("Augment the training data: data.augment=true (or your own transforms).",
                  "Regularise: optim.weight_decay=0.01 (or more), model.args.dropout=0.1.",
                  "Add training data: the gap closes with more examples.")
    if early_stopping:
        return Finding("overfitting", "info", f"overfitting after step {best_step}; early stopping caught it",
                       detail, evidence, (f"Use the weights of step {best_step} (checkpoint `best`).",
                                          *regularise), step=best_step)
    return Finding("overfitting", "warn", f"overfitting after step {best_step}", detail, evidence,
                   (f"Stop at step {best_step}: eval.early_stopping.enabled=true (patience {patience}) keeps "
                    "those weights.", *regularise), step=best_step)


def loss_drop(start: float, end: float, *, perplexity: bool = False) -> float:
    """The share a loss fell from `start` to `end`; `perplexity`: of the perplexity exp(loss) they stand for."""
    return 1.0 - math.exp(min(end - start, 700.0)) if perplexity else (start - end) / start


def underfitting(train: Points, val: Points, *, perplexity: bool = False) -> Finding | None:
    """Train loss that fell but levelled off near its start: the model is not fitting even the train set.
    `perplexity`: a language model's share kept is of the perplexity its loss stands for (convergence.py)."""
    if len(train) < 6:
        return None
    values = [v for _, v in train]
    start, end = float(np.mean(values[:2])), float(np.mean(values[-2:]))
    half_step, half = train[len(values) // 2]
    if start <= 0 or not math.isfinite(end):
        return None
    kept = 1.0 - loss_drop(start, end, perplexity=perplexity)
    recent_change = (half - end) / half if half > 0 else 0.0
    if kept < UNDERFIT_KEPT or recent_change > PLATEAU_CHANGE:
        return None
    val_end = val[-1][1] if val else None
    gap = None if val_end is None else val_end - end
    return Finding(
        "underfitting", "warn", f"underfitting: train loss levelled off at {kept:.0%} of its start",
        f"Train loss went from {start:.4g} to only {end:.4g} and changed {recent_change:.1%} since step "
        f"{half_step}" + (f"; val loss ends at {val_end:.4g} (gap {gap:.3g}): both are high." if gap is not None
                          else "."),
        {"start_train_loss": start, "end_train_loss": end, "share_kept": kept, "plateau_from_step": half_step,
         "second_half_change": recent_change, "end_val_loss": val_end, "gap": gap,
         "rule": f"kept > {UNDERFIT_KEPT} and second-half change < {PLATEAU_CHANGE}"},
        ("Raise optim.lr (try ×3), or find it: `trainwise lr-find RECIPE --out lr-find`.",
         "Train longer: raise train.max_steps.",
         "Use a bigger model (model.args, e.g. wider hidden layers).",
         "Lower the regularisation: optim.weight_decay, model.args.dropout, train.label_smoothing."),
        step=half_step)


def noisy_validation(records: list[dict[str, Any]], monitor: str = "val/loss") -> Finding | None:
    """A val curve that zig-zags by more than a quarter of the improvement it shows."""
    split, _, key = monitor.rpartition("/")
    points = [(s, v) for s, v in series(records, split or "val", key) if math.isfinite(v)]
    if len(points) < 5:
        return None
    values = np.array([v for _, v in points])
    diffs = np.diff(values)
    flips = int((np.sign(diffs[:-1]) * np.sign(diffs[1:]) < 0).sum())  # signs: no overflow
    flip_share = flips / (len(diffs) - 1)
    jitter = float(np.abs(values[1:-1] - (values[:-2] + values[2:]) / 2).mean())
    improvement = float(abs(values[0] - (values.min() if metric_mode(monitor) == "min" else values.max())))
    if flip_share < NOISE_FLIPS or jitter <= NOISE_TO_SIGNAL * max(improvement, 1e-12):
        return None
    return Finding(
        "noisy_validation", "warn", f"{monitor} is noisy: a best step picked on it is partly luck",
        f"{monitor} changes direction at {flips} of {len(diffs) - 1} evaluations; it jitters by {jitter:.3g} "
        f"against an overall improvement of {improvement:.3g}.",
        {"evaluations": len(points), "direction_changes": flips, "jitter": jitter, "improvement": improvement,
         "rule": f"direction changes ≥ {NOISE_FLIPS:.0%} and jitter > {NOISE_TO_SIGNAL} × improvement"},
        ("Enlarge the validation split (data.val_fraction).",
         f"Set eval.early_stopping.min_delta to about {jitter:.2g}, with more patience.",
         "Compare variants over several seeds: `trainwise ablate --seeds 3`."), step=points[-1][0])


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
    if not all(math.isfinite(g) for g in gains) or min(gains) <= STILL_IMPROVING_GAIN:
        return None
    return Finding(
        "still_improving", "info", f"{monitor} was still improving when training stopped",
        f"{monitor} improved at each of the last evaluations ({', '.join(f'{v:.4g}' for v in last)}); "
        "training stopped before it levelled off.",
        {"last_values": last, "relative_gains": gains, "rule": f"each gain > {STILL_IMPROVING_GAIN}"},
        ("Train longer (raise train.max_steps) and let early stopping pick the end.",), step=points[-1][0])


def _train_loss_near(train: Points, step: int, window: int = 3) -> float:
    """Mean of the last few train losses logged at or before `step` (train losses are per-batch noisy)."""
    before = [v for s, v in train if s <= step] or [train[0][1]]
    return float(np.mean(before[-window:]))
