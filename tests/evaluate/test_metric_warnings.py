"""The warnings a user reads when a headline number hides a useless model."""
from __future__ import annotations

import numpy as np

from trainwise.evaluate.metric_warnings import metric_warnings
from trainwise.evaluate.metrics import classification_metrics, regression_metrics


def _kinds(warnings):
    return {w["kind"] for w in warnings}


def test_a_model_that_always_says_benign_is_called_out_with_the_baseline():
    # 90% accuracy on a 90/10 split by never predicting the disease
    targets = np.array([0] * 90 + [1] * 10)
    probabilities = np.tile([0.8, 0.2], (100, 1))
    m = classification_metrics(targets, probabilities, ["benign", "malignant"])
    warnings = metric_warnings(m)
    assert {"no_better_than_majority", "never_predicts_minority", "weak_class"} <= _kinds(warnings)
    baseline = next(w for w in warnings if w["kind"] == "no_better_than_majority")
    assert baseline["evidence"]["baseline_class"] == "benign"
    assert baseline["evidence"]["baseline_accuracy"] == 0.9 and baseline["evidence"]["model_accuracy"] == 0.9
    minority = next(w for w in warnings if w["kind"] == "never_predicts_minority")
    assert minority["evidence"]["minority_class"] == "malignant" and "all 10 malignant" in minority["message"]


def test_a_weak_class_names_its_recall_and_where_its_samples_went():
    targets = np.repeat([0, 1, 2], 20)
    predicted = targets.copy()
    predicted[40:52] = 1  # 12 of the 20 samples of class 2 called class 1
    m = classification_metrics(targets, np.eye(3)[predicted], ["cat", "dog", "fox"])
    [weak] = [w for w in metric_warnings(m) if w["kind"] == "weak_class"]
    assert weak["evidence"]["class"] == "fox" and weak["evidence"]["recall"] == 0.4
    assert weak["evidence"]["most_confused_with"] == "dog" and "12 of the 12 misses" in weak["message"]


def test_a_good_model_gets_no_warnings():
    targets = np.repeat([0, 1], 50)
    probabilities = np.eye(2)[targets] * 0.9 + 0.05
    assert metric_warnings(classification_metrics(targets, probabilities)) == []


def test_regression_no_better_than_the_mean():
    targets = np.arange(10.0)
    [warning] = metric_warnings(regression_metrics(targets, np.full(10, 20.0)))
    assert warning["kind"] == "no_better_than_mean" and warning["evidence"]["baseline_rmse"] < warning[
        "evidence"]["model_rmse"]
    assert metric_warnings(regression_metrics(targets, targets + 0.1)) == []
