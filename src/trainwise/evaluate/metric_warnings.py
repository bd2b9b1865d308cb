"""Warnings about what a headline number hides, each with the numbers that prove it.

Pure functions over a metrics dict (from metrics.py / ranking.py). A warning has the shape of an event in
events.jsonl: {"kind", "severity", "message", "evidence"}, so the report shows them side by side.
"""
from __future__ import annotations

from typing import Any

# a class's recall this far (absolute) below overall accuracy is called out
RECALL_GAP = 0.15
# classes rarer than this in the split give too noisy a recall to warn about
MIN_SUPPORT = 5


def metric_warnings(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    task = metrics.get("task")
    if task == "classification":
        return classification_warnings(metrics)
    if task == "regression":
        return regression_warnings(metrics)
    if task == "ranking":
        return ranking_warnings(metrics)
    return []


def classification_warnings(metrics: dict[str, Any], *, recall_gap: float = RECALL_GAP,
                            min_support: int = MIN_SUPPORT) -> list[dict[str, Any]]:
    found = []
    accuracy = metrics["accuracy"]
    baseline = metrics["majority_baseline"]
    if accuracy <= baseline["accuracy"]:
        found.append(_warning(
            "no_better_than_majority", "error",
            f"accuracy {accuracy:.3f} is no better than always answering {baseline['class']!r} "
            f"({baseline['accuracy']:.3f}); the model has learnt nothing accuracy can show. "
            f"Balanced accuracy: {metrics['balanced_accuracy']:.3f} vs {baseline['balanced_accuracy']:.3f} "
            "for the baseline.",
            model_accuracy=accuracy, baseline_class=baseline["class"], baseline_accuracy=baseline["accuracy"],
            model_balanced_accuracy=metrics["balanced_accuracy"],
            baseline_balanced_accuracy=baseline["balanced_accuracy"]))

    per_class = metrics["per_class"]
    if metrics["num_classes"] == 2:
        present = [c for c in per_class if c["support"] > 0]
        if len(present) == 2:
            minority = min(present, key=lambda c: c["support"])
            if minority["predicted"] == 0:
                found.append(_warning(
                    "never_predicts_minority", "error",
                    f"the model never predicts {minority['class']!r}: all {minority['support']} "
                    f"{minority['class']} cases were called {_other(per_class, minority)['class']!r}. "
                    "Its accuracy is the share of the majority class and nothing more.",
                    minority_class=minority["class"], minority_support=minority["support"],
                    minority_predicted=0, accuracy=accuracy))

    matrix = metrics["confusion_matrix"]["counts"]
    for row in per_class:
        if row["support"] < min_support or row["recall"] is None:
            continue
        if row["recall"] < accuracy - recall_gap:
            confused = _most_confused_with(matrix, row["index"])
            missed = row["support"] - matrix[row["index"]][row["index"]]
            detail = ""
            if confused is not None:
                detail = (f"; {matrix[row['index']][confused]} of the {missed} misses were called "
                          f"{per_class[confused]['class']!r}")
            found.append(_warning(
                "weak_class", "warning",
                f"class {row['class']!r}: recall {row['recall']:.3f} is far below accuracy {accuracy:.3f} "
                f"({missed} of {row['support']} missed{detail}). Look at this class before trusting the "
                "headline number: more or reweighted data for it, or a decision threshold tuned for it.",
                **{"class": row["class"]}, recall=row["recall"], accuracy=accuracy, support=row["support"],
                missed=missed, most_confused_with=None if confused is None else per_class[confused]["class"]))
    return found


def regression_warnings(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    baseline = metrics["mean_baseline"]
    if metrics["rmse"] >= baseline["rmse"]:
        r2 = "undefined" if metrics["r2"] is None else f"{metrics['r2']:.4f}"
        return [_warning(
            "no_better_than_mean", "error",
            f"RMSE {metrics['rmse']:.4g} is no better than predicting the mean target "
            f"({baseline['rmse']:.4g}); R² = {r2}. Check the features carry signal and the loss is falling.",
            model_rmse=metrics["rmse"], baseline_rmse=baseline["rmse"], r2=metrics["r2"])]
    return []


def ranking_warnings(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for key, chance in metrics.get("random_baseline", {}).items():
        if metrics.get(key) is not None and metrics[key] <= chance:
            found.append(_warning(
                "no_better_than_random", "error",
                f"{key.upper()} {metrics[key]:.3f} is no better than ranking at random ({chance:.3f}).",
                metric=key, model=metrics[key], random=chance))
    return found


def _most_confused_with(matrix: list[list[int]], row: int) -> int | None:
    others = [(count, col) for col, count in enumerate(matrix[row]) if col != row and count > 0]
    return max(others)[1] if others else None


def _other(per_class: list[dict], row: dict) -> dict:
    return next(c for c in per_class if c["index"] != row["index"])


def _warning(kind: str, severity: str, message: str, **evidence: Any) -> dict[str, Any]:
    return {"kind": kind, "severity": severity, "message": message, "evidence": evidence}
