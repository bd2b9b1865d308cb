"""The full set of metrics for one split: what accuracy alone does not say.

Classification: accuracy, balanced accuracy, per-class precision/recall/F1/support, macro and weighted
averages, the confusion matrix (counts and row-normalised), ROC-AUC and PR-AUC for binary tasks, expected
calibration error, log loss, and the majority-class baseline beside the model. Regression: MAE, RMSE, R²
and the predict-the-mean baseline. Everything derived from the confusion matrix is computed here with numpy;
the tests check each number against scikit-learn on the same predictions.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainwise.runtime.arrays import as_numpy

CALIBRATION_BINS = 15


def softmax(logits: Any) -> np.ndarray:
    logits = as_numpy(logits).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)  # no overflow for large logits
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


# ---- classification ---------------------------------------------------------------------------------------

def confusion_counts(targets: np.ndarray, predicted: np.ndarray, num_classes: int) -> np.ndarray:
    """counts[i, j] = samples of true class i predicted as class j."""
    flat = targets.astype(np.int64) * num_classes + predicted.astype(np.int64)
    return np.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def classification_metrics(targets: Any, probabilities: Any, class_names: Sequence[str] | None = None,
                           *, calibration_bins: int = CALIBRATION_BINS) -> dict[str, Any]:
    """Every classification metric for integer `targets` [N] and class `probabilities` [N, C]."""
    targets = as_numpy(targets).astype(np.int64)
    probabilities = as_numpy(probabilities).astype(np.float64)
    n, num_classes = probabilities.shape
    names = list(class_names) if class_names else [str(c) for c in range(num_classes)]
    predicted = probabilities.argmax(axis=1)
    counts = confusion_counts(targets, predicted, num_classes)

    support = counts.sum(axis=1)
    predicted_count = counts.sum(axis=0)
    true_positive = np.diag(counts)
    precision = _ratio(true_positive, predicted_count)
    recall = _ratio(true_positive, support)
    f1 = _ratio(2 * precision * recall, precision + recall)
    # like scikit-learn's defaults: averages run over the classes that occur in targets or predictions
    seen = (support > 0) | (predicted_count > 0)
    per_class = [{
        "class": names[c], "index": c, "precision": float(precision[c]), "recall": float(recall[c]),
        "f1": float(f1[c]), "support": int(support[c]), "predicted": int(predicted_count[c]),
    } if seen[c] else {"class": names[c], "index": c, "precision": None, "recall": None, "f1": None,
                       "support": 0, "predicted": 0} for c in range(num_classes)]

    weights = support[seen] / max(support[seen].sum(), 1)
    majority = int(support.argmax())
    metrics: dict[str, Any] = {
        "task": "classification",
        "samples": int(n),
        "num_classes": int(num_classes),
        "accuracy": float(true_positive.sum() / n),
        # recall averaged over the classes present: every class counts the same, however rare
        "balanced_accuracy": float(recall[support > 0].mean()),
        "macro": {"precision": float(precision[seen].mean()), "recall": float(recall[seen].mean()),
                  "f1": float(f1[seen].mean())},
        "weighted": {"precision": float(weights @ precision[seen]), "recall": float(weights @ recall[seen]),
                     "f1": float(weights @ f1[seen])},
        "per_class": per_class,
        "confusion_matrix": {
            "labels": names, "rows": "true class", "columns": "predicted class",
            "counts": counts.tolist(),
            "normalized": (counts / np.maximum(support[:, None], 1)).round(6).tolist(),
        },
        "log_loss": log_loss(targets, probabilities),  # also under "loss", to line up with val/loss
        "majority_baseline": {"class": names[majority], "accuracy": float(support[majority] / n),
                              "balanced_accuracy": float(1.0 / (support > 0).sum())},
    }
    metrics["loss"] = metrics["log_loss"]
    metrics.update(calibration(targets, probabilities, bins=calibration_bins))
    if num_classes == 2:
        metrics.update(binary_ranking_quality(targets, probabilities[:, 1]))
    return metrics


def log_loss(targets: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean cross-entropy of the true class (probabilities clipped as scikit-learn does)."""
    eps = np.finfo(probabilities.dtype).eps
    picked = np.clip(probabilities[np.arange(len(targets)), targets], eps, 1 - eps)
    return float(-np.log(picked).mean())


def calibration(targets: np.ndarray, probabilities: np.ndarray, *, bins: int = CALIBRATION_BINS) -> dict:
    """Expected calibration error of the top-label confidence over equal-width bins.

    ECE = sum over bins of (share of samples) x |accuracy - mean confidence|. A model that says "90% sure"
    should be right 90% of the time; the table per bin is kept for the reliability diagram.
    """
    confidence = probabilities.max(axis=1)
    correct = (probabilities.argmax(axis=1) == targets).astype(np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    bin_ids = np.searchsorted(edges[1:-1], confidence)  # same binning as sklearn's calibration_curve
    total = np.bincount(bin_ids, minlength=bins)
    confidence_sum = np.bincount(bin_ids, weights=confidence, minlength=bins)
    correct_sum = np.bincount(bin_ids, weights=correct, minlength=bins)
    table, ece = [], 0.0
    for b in np.flatnonzero(total):
        mean_confidence = confidence_sum[b] / total[b]
        accuracy = correct_sum[b] / total[b]
        ece += total[b] / len(targets) * abs(accuracy - mean_confidence)
        table.append({"lower": float(edges[b]), "upper": float(edges[b + 1]), "count": int(total[b]),
                      "confidence": float(mean_confidence), "accuracy": float(accuracy)})
    return {"ece": float(ece), "calibration_bins": table}


def binary_ranking_quality(targets: np.ndarray, positive_score: np.ndarray) -> dict[str, Any]:
    """ROC-AUC and PR-AUC (average precision) of the positive class (index 1); None when a class is absent."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    if len(np.unique(targets)) < 2:
        return {"roc_auc": None, "pr_auc": None,
                "auc_note": "only one class occurs in this split, so ROC-AUC and PR-AUC are undefined"}
    return {"roc_auc": float(roc_auc_score(targets, positive_score)),
            "pr_auc": float(average_precision_score(targets, positive_score)),
            "pr_auc_baseline": float((targets == 1).mean())}  # PR-AUC of a random scorer


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator with 0 where the denominator is 0 (scikit-learn's zero_division=0)."""
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    out = np.zeros_like(numerator)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


# ---- regression -------------------------------------------------------------------------------------------

def regression_metrics(targets: Any, predictions: Any) -> dict[str, Any]:
    """MAE, RMSE and R² of predictions [N] or [N, 1], beside the predict-the-mean baseline."""
    targets = as_numpy(targets).astype(np.float64).reshape(-1)
    predictions = as_numpy(predictions).astype(np.float64).reshape(-1)
    error = predictions - targets
    spread = targets - targets.mean()
    total = float(spread @ spread)
    return {
        "task": "regression",
        "samples": int(len(targets)),
        "mae": float(np.abs(error).mean()),
        "rmse": float(np.sqrt((error ** 2).mean())),
        "loss": float((error ** 2).mean()),
        # R² is undefined for a constant target (no variance to explain)
        "r2": float(1.0 - (error @ error) / total) if total > 0 else None,
        "mean_baseline": {"mae": float(np.abs(spread).mean()), "rmse": float(np.sqrt((spread ** 2).mean()))},
    }
