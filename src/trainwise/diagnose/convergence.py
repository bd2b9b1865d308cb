"""Is training converging at all? A non-finite loss, a loss climbing back (diverging), one that swings up and
down (oscillating), one that does not fall after warmup (flat), and gradient-norm spikes.

Pure functions over metrics.jsonl records: the train records carry `loss` (mean over the log interval),
`lr` and `grad_norm` (the last step's, before clipping). Every finding quotes the LR and the gradient norms
at its step, because the first suspect of a loss that will not go down is the learning rate.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainwise.diagnose.task_profile import TaskProfile
from trainwise.diagnose.curves import Points, loss_drop, series, value_at
from trainwise.findings import Finding

# Logged train losses after warmup needed before calling a trend: fewer are a few noisy batches.
MIN_POINTS = 6
# Post-warmup train loss must fall by at least this share of where it started; less is "not learning".
# Healthy runs drop by far more than 10% within their first few hundred steps. A language model's loss is
# measured as the perplexity it stands for: its cross-entropy sits on top of the text's own entropy, so
# 3.0 -> 2.75 nats (8%) is perplexity 20 -> 15.6 (22%), a normal fine-tune or end of a cosine schedule.
FLAT_MIN_DROP = 0.10
# A curve that fell by FLAT_MIN_DROP from its first log (warmup included) and still falls steadily after
# it (rank correlation of loss with step at most this) learnt and is levelling off, as a decaying LR makes it.
STEADY_FALL_CORRELATION = -0.5
# Diverging: the smoothed loss ends above where it started and this many times its minimum.
DIVERGE_FACTOR = 1.5
# A gradient norm this many times the median of the previous logs is a spike, not drift: the usual
# fluctuation of a healthy run stays within 2-3×.
GRAD_SPIKE_FACTOR = 10.0
GRAD_SPIKE_HISTORY = 5  # logs that make up the running median a spike is measured against
# Oscillating: the loss changes direction at this share of logs...
OSCILLATION_FLIPS = 0.5
# ...by more than this share of the drop it made: swings that large are the optimizer overshooting.
OSCILLATION_AMPLITUDE = 0.25
# The drop an oscillation is measured against is at least this share of the loss level, so the small
# jitter of a curve that does not fall at all reads as flat, not oscillating.
LEVEL_FLOOR = 0.1
# At chance: cross-entropy within this share of ln(C), the loss of predicting every class equally, where C
# is read off the balanced accuracy (1/C at chance) — and no better than chance by more than this margin.
CHANCE_LOSS_TOLERANCE = 0.05
CHANCE_ACCURACY_MARGIN = 0.05
# A ranking metric (NDCG@10) counts as chance below this many times what a random ranking scores: healthy
# recommenders score tens of times chance within their first pass.
CHANCE_RANKING_FACTOR = 2.0
# Train logs at exactly zero loss and zero gradient norm before calling the loss dead.
ZERO_LOSS_LOGS = 3

LR_SWEEP = "Find the LR: `trainwise lr-find RECIPE --out lr-find` (it prints the optim.lr override to use)."
CHECK_INPUTS = ("Check the inputs and labels: `trainwise check RECIPE` (labels per split, NaN/Inf, scale, rows "
                "leaked between splits, and whether the model can overfit one batch).")


def convergence_findings(records: list[dict[str, Any]], *, warmup_steps: int = 0,
                         task: TaskProfile | None = None) -> list[Finding]:
    """At most one of non-finite / diverging / oscillating / flat (the first that fires explains the
    others), plus gradient spikes when the loss did not diverge from them. `task`: what chance is for this
    run (summary.json's `task`); without it the at-chance rule stays silent."""
    stopped = loss_nonfinite(records) or loss_stuck_at_zero(records)
    if stopped is not None:
        return [stopped]  # every number after a NaN is meaningless; a loss of 0 has nothing more to say
    train = [(s, v) for s, v in series(records, "train", "loss") if s > warmup_steps and math.isfinite(v)]
    # flat before oscillating: batch-to-batch jitter of a loss that does not fall is not an overshooting
    # optimizer, and "find a working LR" is the advice for both
    found = (diverging(records, train) or at_chance(records, train, task)
             or flat(records, train, warmup_steps, task) or oscillating(records, train))
    spikes = gradient_spikes(records, warmup_steps)
    if spikes is not None and (found is None or found.code != "loss_diverging"):
        return [f for f in (found, spikes) if f is not None]
    return [found] if found is not None else []


def loss_nonfinite(records: list[dict[str, Any]]) -> Finding | None:
    for r in records:
        loss = r.get("loss")
        if r.get("split") == "train" and isinstance(loss, float) and not math.isfinite(loss):
            step = r["step"]
            evidence = {"step": step, "loss": loss, "lr": r.get("lr"), "grad_norm": r.get("grad_norm"),
                        **_grad_norms(records, step)}
            return Finding("loss_nonfinite", "error", f"train loss became {loss} at step {step}",
                           f"The train loss logged at step {step} is {loss} (LR {_fmt(r.get('lr'))}, gradient norm "
                           f"{_fmt(r.get('grad_norm'))}): training diverged numerically.", evidence,
                           ("Lower optim.lr (try a third) and add warmup (schedule.warmup_steps).",
                            "Keep train.grad_clip_norm on; in fp16, try train.precision=bf16.", CHECK_INPUTS),
                           step=step)
    return None


def diverging(records: list[dict[str, Any]], train: Points) -> Finding | None:
    """A loss that fell and then climbed back above where it started."""
    if len(train) < 4:
        return None
    steps = [s for s, _ in train]
    smooth = _rolling_median([v for _, v in train])
    low = int(np.argmin(smooth))
    first, minimum, last = smooth[0], smooth[low], smooth[-1]
    if not (last > first and last > DIVERGE_FACTOR * minimum):
        return None
    turn = next(i for i in range(low, len(smooth)) if smooth[i] > DIVERGE_FACTOR * minimum)
    turn_step = steps[turn]
    lr = value_at(records, "train", "lr", turn_step)
    spikes = _spikes(records, 0)
    evidence = {"start_loss": first, "min_loss": minimum, "min_step": steps[low], "last_loss": last,
                "last_step": steps[-1], "turn_step": turn_step, "lr_at_turn": lr,
                **_grad_norms(records, turn_step), "grad_norm_spikes": len(spikes),
                "largest_grad_spike": max(spikes, key=lambda p: p["ratio"]) if spikes else None,
                "rule": f"smoothed loss ends above its start and > {DIVERGE_FACTOR} × its minimum"}
    spiked = f"; the gradient norm spiked {len(spikes)} time(s)" if spikes else ""
    return Finding(
        "loss_diverging", "error", f"training diverged: loss climbing since step {turn_step}",
        f"Train loss fell to {minimum:.4g} at step {steps[low]}, then climbed to {last:.4g} by step {steps[-1]}, "
        f"above where it started ({first:.4g}); the LR was {_fmt(lr)} at step {turn_step}{spiked}.", evidence,
        (f"Lower optim.lr (try a third{f' of {lr:.3g}' if lr else ''}) and resume from a checkpoint before step "
         f"{turn_step}.", "Lengthen the warmup (schedule.warmup_steps) and keep train.grad_clip_norm on.",
         LR_SWEEP, CHECK_INPUTS), step=turn_step)


def at_chance(records: list[dict[str, Any]], train: Points, task: TaskProfile | None = None) -> Finding | None:
    """A model whose train loss settled at the task's chance loss (ln C for C classes, ln(items) for a full
    softmax recommender, ln(1 + negatives) for a sampled one) with a chance-level validation metric: it
    predicts everything alike. Typical after a learning rate so high that the first steps blew the weights
    up (the loss spikes, then collapses to the uniform prediction and stays there), or labels that carry no
    signal. Silent when the task does not say what chance is."""
    if task is None or task.chance_loss is None or not task.chance_loss > 0 or len(train) < MIN_POINTS:
        return None
    metric = _chance_metric(records, task)
    if metric is None:
        return None
    name, step, value, chance_value = metric
    chance = task.chance_loss
    settled = float(np.median([v for _, v in train[len(train) // 2:]]))
    if abs(settled - chance) > CHANCE_LOSS_TOLERANCE * chance:
        return None
    since = next(s for s, v in train if abs(v - chance) <= CHANCE_LOSS_TOLERANCE * chance)
    peak_step, peak = max(series(records, "train", "loss"), key=lambda point: point[1] if math.isfinite(point[1])
                          else -math.inf)
    lr = value_at(records, "train", "lr", since)
    blew_up = peak > 3 * chance
    if not blew_up and all(abs(v - chance) <= CHANCE_LOSS_TOLERANCE * chance for _, v in train):
        return None  # it never left chance: a model that does not learn at all, which `flat` names with its LR
    return Finding(
        "loss_at_chance", "error", f"the model predicts at chance: loss {settled:.3f} ≈ {chance:.3f} "
        f"({task.detail}) since step {since}",
        f"The train loss has sat at {settled:.4g}, the loss of a model that knows nothing ({task.detail}: "
        f"{chance:.4g}), since step {since}, and validation {name} is {value:.3g} at step {step} (chance: "
        f"{chance_value:.3g})." + (f" The loss first spiked to {peak:.4g} at step {peak_step}: the learning "
        f"rate ({_fmt(lr)}) blew the weights up." if blew_up else ""),
        {"settled_loss": settled, "chance_loss": chance, "task": task.kind, "task_detail": task.detail,
         **({"classes": round(1 / chance_value)} if name == "balanced_accuracy" else {}),
         name: value, f"chance_{name}": chance_value, "since_step": since, "peak_loss": peak,
         "peak_step": peak_step, "lr": lr, **_grad_norms(records, since),
         "rule": f"|loss - chance loss| < {CHANCE_LOSS_TOLERANCE:.0%} and validation {name} at chance"},
        ((f"Lower optim.lr (try a tenth{f' of {lr:.3g}' if lr else ''}), lengthen schedule.warmup_steps and keep "
          "train.grad_clip_norm on." if blew_up else "Check that the labels carry signal: `trainwise check RECIPE`."),
         LR_SWEEP, CHECK_INPUTS), step=since)


def _chance_metric(records: list[dict[str, Any]], task: TaskProfile) -> tuple[str, int, float, float] | None:
    """(metric, step, value, its chance value) of the newest validation record when it is at chance: within
    CHANCE_ACCURACY_MARGIN of chance for an accuracy, under twice chance for a ranking metric."""
    for name, chance_value in task.chance_metrics.items():
        points = [(s, v) for s, v in series(records, "val", name) if math.isfinite(v)]
        if not points:
            continue
        step, value = points[-1]
        at_chance = (value <= chance_value + CHANCE_ACCURACY_MARGIN if name.endswith("accuracy")
                     else value <= CHANCE_RANKING_FACTOR * chance_value)
        return (name, step, value, chance_value) if at_chance else None
    return None


def loss_stuck_at_zero(records: list[dict[str, Any]]) -> Finding | None:
    """A train loss of exactly 0 with zero gradients at every log: the loss cannot move the weights. Typically
    cross-entropy over a model with one output (one class: always right), or a loss that ignores its input."""
    train = [r for r in records if r.get("split") == "train" and isinstance(r.get("loss"), (int, float))]
    if len(train) < ZERO_LOSS_LOGS or any(r["loss"] != 0 or r.get("grad_norm") not in (0, 0.0) for r in train):
        return None
    first, last = train[0]["step"], train[-1]["step"]
    return Finding(
        "loss_zero", "error", f"the loss is exactly 0 with zero gradients from step {first}: nothing is learnt",
        f"Every train log from step {first} to {last} ({len(train)} logs) records a loss of 0 and a gradient norm "
        "of 0: the weights never move. Cross-entropy over a model with a single output does this (one class "
        "is always right), e.g. a regression model trained as a classifier.",
        {"first_step": first, "last_step": last, "logs": len(train), "loss": 0.0, "grad_norm": 0.0,
         "rule": f"loss == 0 and grad_norm == 0 at every one of ≥ {ZERO_LOSS_LOGS} train logs"},
        ("Regression: give float targets (one per sample) and a model with one output, or pass "
         "data_spec=DataSpec(..., task='regression') to the Trainer.",
         "Classification: the model needs one output per class (num_classes), and integer class labels.",
         CHECK_INPUTS), step=first)


def oscillating(records: list[dict[str, Any]], train: Points) -> Finding | None:
    """A loss that keeps changing direction by a large share of the drop it made."""
    if len(train) < MIN_POINTS:
        return None
    values = np.array([v for _, v in train])
    diffs = np.diff(values)
    flips = int((np.sign(diffs[:-1]) * np.sign(diffs[1:]) < 0).sum())  # signs: no overflow
    flip_share = flips / (len(diffs) - 1)
    swings = np.abs(values[1:-1] - (values[:-2] + values[2:]) / 2)
    amplitude = float(swings.mean())
    drop = float(values[0] - values.min())
    reference = max(drop, LEVEL_FLOOR * float(np.median(np.abs(values))))
    if flip_share < OSCILLATION_FLIPS or amplitude <= OSCILLATION_AMPLITUDE * reference:
        return None
    step = train[int(np.argmax(swings)) + 1][0]
    lr = value_at(records, "train", "lr", step)
    return Finding(
        "loss_oscillating", "warn", f"train loss oscillates (largest swing at step {step})",
        f"The loss changes direction at {flips} of {len(diffs) - 1} logs, swinging by {amplitude:.3g} on average "
        f"against an overall drop of {drop:.3g}; the LR was {_fmt(lr)} at step {step}. The optimizer overshoots.",
        {"direction_changes": flips, "logs": len(values), "mean_swing": amplitude, "drop": drop,
         "largest_swing_step": step, "lr": lr, **_grad_norms(records, step),
         "rule": f"direction changes ≥ {OSCILLATION_FLIPS:.0%} and swing > {OSCILLATION_AMPLITUDE} × drop"},
        (f"Lower optim.lr (try a third{f' of {lr:.3g}' if lr else ''}) or lengthen schedule.warmup_steps.",
         "Raise train.batch_size: larger batches average out gradient noise.", LR_SWEEP, CHECK_INPUTS), step=step)


def flat(records: list[dict[str, Any]], train: Points, warmup_steps: int = 0,
         task: TaskProfile | None = None) -> Finding | None:
    """A train loss that has not really fallen since warmup ended, nor learnt before it and kept falling."""
    if len(train) < MIN_POINTS:
        return None
    values = [v for _, v in train]
    start, end = float(np.median(values[:3])), float(np.median(values[-3:]))
    if start <= 0:  # a loss that can be negative has no scale to measure a drop against
        return None
    perplexity = task is not None and task.kind == "language_model"
    drop = loss_drop(start, end, perplexity=perplexity)
    if drop >= FLAT_MIN_DROP or _learnt_and_still_falling(records, train, perplexity):
        return None
    step = train[-1][0]
    lr = value_at(records, "train", "lr", step)
    scale = "perplexity" if perplexity else "loss"
    return Finding(
        "loss_flat", "warn", f"train {scale} is flat: down {max(drop, 0.0):.0%} from step {train[0][0]} to {step}",
        f"After warmup ({warmup_steps} steps) the train loss went from {start:.4g} (step {train[0][0]}) to "
        f"{end:.4g} (step {step}), a drop of {drop:.1%}" + (" in perplexity" if perplexity else "")
        + f"; the LR was {_fmt(lr)}. The model is not learning.",
        {"start_step": train[0][0], "start_loss": start, "end_step": step, "end_loss": end, "drop": drop,
         "measured_on": scale, "warmup_steps": warmup_steps, "lr": lr, **_grad_norms(records, step),
         "rule": f"{scale} drop after warmup < {FLAT_MIN_DROP:.0%}, and no drop of that size since the first log "
                 "with a steady fall after warmup"},
        ("Find a working LR: too low does not move, too high cannot settle. " + LR_SWEEP,
         "Lower optim.lr or lengthen schedule.warmup_steps if the gradient norms are large; raise optim.lr if "
         "they are tiny.", CHECK_INPUTS), step=step)


def _learnt_and_still_falling(records: list[dict[str, Any]], train: Points, perplexity: bool) -> bool:
    """The loss fell by FLAT_MIN_DROP from its first log (during warmup, where a model learns fastest) and
    keeps falling after it, steadily rather than by chance: a curve levelling off, not a model that learns
    nothing."""
    first = next((v for _, v in series(records, "train", "loss") if math.isfinite(v)), None)
    end = float(np.median([v for _, v in train[-3:]]))
    if first is None or first <= 0 or loss_drop(first, end, perplexity=perplexity) < FLAT_MIN_DROP:
        return False
    return _rank_correlation([s for s, _ in train], [v for _, v in train]) <= STEADY_FALL_CORRELATION


def _rank_correlation(xs: list[float], ys: list[float]) -> float:
    """Spearman's: +1 when y always rises with x, -1 when it always falls, near 0 for jitter (no ties expected)."""
    ranks = [np.argsort(np.argsort(np.asarray(a, dtype=float))).astype(float) for a in (xs, ys)]
    spread = float(np.std(ranks[0]) * np.std(ranks[1]))
    return float(np.mean((ranks[0] - ranks[0].mean()) * (ranks[1] - ranks[1].mean()))) / spread if spread else 0.0


def gradient_spikes(records: list[dict[str, Any]], warmup_steps: int = 0) -> Finding | None:
    spikes = _spikes(records, warmup_steps)
    if not spikes:
        return None
    first, largest = spikes[0], max(spikes, key=lambda p: p["ratio"])
    lr = value_at(records, "train", "lr", first["step"])
    return Finding(
        "gradient_spikes", "warn", f"gradient norm spiked {len(spikes)} time(s), first at step {first['step']}",
        f"At step {first['step']} the gradient norm was {first['grad_norm']:.3g}, {first['ratio']:.0f}× the "
        f"running median ({first['median']:.3g}); the largest spike was {largest['ratio']:.0f}× at step "
        f"{largest['step']}. The LR was {_fmt(lr)}. Spikes like these precede divergence, or come from bad "
        "batches (outliers, wrong labels).",
        {"spikes": len(spikes), "first_spike": first, "largest_spike": largest, "lr": lr,
         "rule": f"grad_norm > {GRAD_SPIKE_FACTOR:g} × the median of the previous {GRAD_SPIKE_HISTORY} logs"},
        ("Keep train.grad_clip_norm on (1.0 is a safe start).",
         f"Lower optim.lr or lengthen schedule.warmup_steps{f' (LR was {lr:.3g})' if lr else ''}.",
         CHECK_INPUTS), step=first["step"])


def _spikes(records: list[dict[str, Any]], warmup_steps: int) -> list[dict[str, Any]]:
    norms = [(s, g) for s, g in series(records, "train", "grad_norm") if math.isfinite(g)]
    found = []
    for i in range(GRAD_SPIKE_HISTORY, len(norms)):
        step, norm = norms[i]
        median = float(np.median([g for _, g in norms[i - GRAD_SPIKE_HISTORY:i]]))
        if step > warmup_steps and median > 0 and norm > GRAD_SPIKE_FACTOR * median:
            found.append({"step": step, "grad_norm": norm, "median": median, "ratio": norm / median})
    return found


def _grad_norms(records: list[dict[str, Any]], step: int) -> dict[str, Any]:
    """The gradient norm at `step` and the median and largest ones logged up to it."""
    norms = [g for s, g in series(records, "train", "grad_norm") if s <= step and math.isfinite(g)]
    return {"grad_norm_at_step": value_at(records, "train", "grad_norm", step),
            "grad_norm_median": float(np.median(norms)) if norms else None,
            "grad_norm_max": max(norms) if norms else None}


def _rolling_median(values: list[float], width: int = 3) -> list[float]:
    """Smooth single-log spikes without shifting the curve."""
    half = width // 2
    return [float(np.median(values[max(0, i - half): i + half + 1])) for i in range(len(values))]


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "unknown"
