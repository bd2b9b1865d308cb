"""What kind of problem a run solves, told once: what a model that knows nothing scores (its chance loss and
chance metrics) and which metrics validation measures.

The trainer builds the profile from the data spec and the model and records it in summary.json (`task`);
the rules of `trainwise diagnose` read it there and stay silent where it is missing, so a loss of 5.7 is
never read as "ln 343 classes" on a recommender. Monitor names (`eval.monitor`) are checked against
`metrics` before the first step.

    classification   cross-entropy over C classes: chance ln C, balanced accuracy 1/C
    regression       MSE: no chance loss (it depends on the targets' spread)
    next_item        full softmax over the catalogue (ln items) or a sampled one (ln(1 + negatives));
                     judged by NDCG@10 over a full ranking (chance ≈ 4.54 / items)
    click            a click model against k negatives per positive: chance = the entropy of the click rate
    language_model   next-token cross-entropy: chance ln(vocabulary), perplexity = vocabulary
"""
from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from trainwise.errors import ConfigError

CLASSIFICATION_METRICS = ("loss", "accuracy", "balanced_accuracy")
REGRESSION_METRICS = ("loss", "mae", "rmse")
NEXT_ITEM_METRICS = ("loss", "ndcg@10", "hr@10")
CLICK_METRICS = ("loss", "auc", "accuracy", "balanced_accuracy")
LANGUAGE_MODEL_METRICS = ("loss", "perplexity", "token_accuracy")
# the expected NDCG@10 of a random ranking, times the catalogue size: sum of 1/log2(r + 1) for r = 1..10
RANDOM_NDCG10_TIMES_ITEMS = sum(1 / math.log2(r + 1) for r in range(1, 11))


@dataclass(frozen=True)
class TaskProfile:
    kind: str
    """classification | regression | next_item | click | language_model"""
    metrics: tuple[str, ...]
    """What validation logs during training (monitor as `val/<name>`)."""
    headline: str
    """The metric a run of this kind is judged by, and monitors by default."""
    chance_loss: float | None = None
    """The train loss of a model that knows nothing; None where it cannot be known (regression)."""
    chance_metrics: dict[str, float] = field(default_factory=dict)
    """Validation metrics at chance, e.g. {"balanced_accuracy": 0.1} or {"ndcg@10": 0.0004}."""
    loss: str = "cross_entropy"
    detail: str = ""
    """In words, for findings: "full softmax over 12,102 items"."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "metrics": list(self.metrics)}

    @classmethod
    def from_dict(cls, data: Any) -> "TaskProfile | None":
        """The profile summary.json records, or None when it records none (an older run) or a damaged one."""
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            return None
        try:
            chance = data.get("chance_loss")
            return cls(kind=data["kind"], metrics=tuple(str(m) for m in data.get("metrics") or ()),
                       headline=str(data.get("headline") or "loss"),
                       chance_loss=float(chance) if isinstance(chance, (int, float)) else None,
                       chance_metrics={str(k): float(v) for k, v in (data.get("chance_metrics") or {}).items()},
                       loss=str(data.get("loss") or ""), detail=str(data.get("detail") or ""))
        except (TypeError, ValueError):
            return None


VALIDATION_METRICS = {"classification": CLASSIFICATION_METRICS, "click": CLICK_METRICS,
                      "regression": REGRESSION_METRICS, "next_item": NEXT_ITEM_METRICS,
                      "language_model": LANGUAGE_MODEL_METRICS}


def classification_profile(classes: int) -> TaskProfile:
    return TaskProfile("classification", CLASSIFICATION_METRICS, "accuracy", math.log(classes),
                       {"balanced_accuracy": 1 / classes}, "cross_entropy", f"{classes} classes")


def regression_profile() -> TaskProfile:
    return TaskProfile("regression", REGRESSION_METRICS, "loss", None, {}, "mse", "one output")


def next_item_profile(items: int, sampled: int | None = None) -> TaskProfile:
    """A next-item recommender; `sampled`: the negatives of a sampled softmax (None: full softmax). The
    chance loss is the training loss's: the sampled softmax picks the target among 1 + `sampled` items."""
    chance = math.log(1 + sampled) if sampled else math.log(items)
    detail = (f"sampled softmax, {sampled:,} negatives among {items:,} items" if sampled
              else f"full softmax over {items:,} items")
    return TaskProfile("next_item", NEXT_ITEM_METRICS, "ndcg@10", chance,
                       {"ndcg@10": RANDOM_NDCG10_TIMES_ITEMS / items, "hr@10": min(1.0, 10 / items)},
                       "sampled_softmax" if sampled else "cross_entropy", detail)


def click_profile(negatives: int) -> TaskProfile:
    """A click model against `negatives` non-clicks per click: knowing nothing, it predicts the click rate."""
    rate = 1 / (1 + negatives)
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return TaskProfile("click", CLICK_METRICS, "auc", entropy, {"balanced_accuracy": 0.5},
                       "cross_entropy", f"click model, {negatives} negatives per click")


def language_model_profile(vocabulary: int, instruct: bool = False) -> TaskProfile:
    """Next-token prediction: uniform over the vocabulary is ln(vocabulary), a perplexity of the vocabulary.
    `instruct`: an instruction fine-tune, its loss on the answer tokens only."""
    what = "instruction fine-tune (loss on the answers)" if instruct else "language model"
    return TaskProfile("language_model", LANGUAGE_MODEL_METRICS, "loss", math.log(vocabulary),
                       {"perplexity": float(vocabulary)}, "cross_entropy", f"{what}, vocabulary of {vocabulary:,}")


def task_profile(spec: Any, model: Any = None) -> TaskProfile | None:
    """The profile of a run on data described by `spec` (a DataSpec) with `model`; None when the data does
    not say enough (a classifier without num_classes), so the rules that need it stay silent."""
    objective = getattr(spec, "objective", None)
    if objective == "next_item" and getattr(spec, "num_items", 0):
        negatives = getattr(model, "negatives", None)
        return next_item_profile(spec.num_items, getattr(negatives, "num_sampled", None) if negatives else None)
    if objective == "ctr":
        return click_profile(getattr(spec, "negatives", 0) or 1)
    if getattr(spec, "task", None) == "regression":
        return regression_profile()
    if getattr(spec, "task", None) in ("causal_lm", "language_model") and getattr(spec, "num_classes", None):
        return language_model_profile(spec.num_classes, bool(getattr(spec, "instruct", False)))
    classes = getattr(spec, "num_classes", None)
    return classification_profile(classes) if isinstance(classes, int) and classes >= 2 else None


def validation_kind(spec: Any, profile: TaskProfile | None) -> str:
    """Which metrics validation logs: the profile's kind, else the spec's task (a classifier whose class count
    is unknown still logs accuracy)."""
    return profile.kind if profile is not None else str(getattr(spec, "task", "classification"))


def run_profile(spec: Any, model: Any, monitor: str | None) -> tuple[TaskProfile | None, str]:
    """(profile, validation kind) of a run; `monitor`, when the run validates, is checked against the metrics
    validation logs (ConfigError before step 1, with the name meant)."""
    profile = task_profile(spec, model)
    kind = validation_kind(spec, profile)
    if monitor is not None:
        check_monitor(monitor, kind)
    return profile, kind


def check_monitor(monitor: str, metrics: tuple[str, ...] | str, *, override: str = "eval.monitor") -> None:
    """ConfigError before step 1 when `monitor` is not one of the metrics validation will log (`metrics`: their
    names, or the kind of task whose names they are)."""
    if isinstance(metrics, str):
        metrics = VALIDATION_METRICS.get(metrics, ("loss",))
    known = [f"val/{m}" for m in metrics]
    if monitor in known:
        return
    close = difflib.get_close_matches(monitor, known, n=1, cutoff=0.5) or [
        k for k in known if k.startswith(monitor) or monitor.removeprefix("val/") in k][:1]
    hint = f" Did you mean {close[0]}?" if close else ""
    raise ConfigError(f"{override}={monitor!r} is not measured: validation of this task logs "
                      f"{', '.join(known)}.{hint} Set {override}=<one of them>.")

