"""Every metric checked against scikit-learn on the same predictions."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as sk
from sklearn.calibration import calibration_curve

from trainwise.evaluate.metrics import classification_metrics, regression_metrics, softmax
from trainwise.recsys.metrics import ranking_metrics


def _predictions(n=400, classes=4, seed=0, skill=1.5):
    rng = np.random.default_rng(seed)
    targets = rng.choice(classes, size=n, p=np.linspace(1, 2, classes) / np.linspace(1, 2, classes).sum())
    logits = rng.normal(size=(n, classes))
    logits[np.arange(n), targets] += skill  # a model that is right more often than not
    return targets, softmax(logits)


def _check_against_sklearn(targets, probabilities):
    m = classification_metrics(targets, probabilities)
    predicted = probabilities.argmax(1)
    classes = probabilities.shape[1]
    assert m["accuracy"] == pytest.approx(sk.accuracy_score(targets, predicted))
    assert m["balanced_accuracy"] == pytest.approx(sk.balanced_accuracy_score(targets, predicted))
    assert m["confusion_matrix"]["counts"] == sk.confusion_matrix(targets, predicted,
                                                                  labels=range(classes)).tolist()
    p, r, f, s = sk.precision_recall_fscore_support(targets, predicted, labels=range(classes), zero_division=0)
    for c, row in enumerate(m["per_class"]):
        if row["support"] or row["predicted"]:
            assert (row["precision"], row["recall"], row["f1"]) == pytest.approx((p[c], r[c], f[c]))
        assert row["support"] == s[c]
    for average in ("macro", "weighted"):
        expected = sk.precision_recall_fscore_support(targets, predicted, average=average, zero_division=0)[:3]
        got = m[average]
        assert (got["precision"], got["recall"], got["f1"]) == pytest.approx(expected)
    assert m["log_loss"] == pytest.approx(sk.log_loss(targets, probabilities, labels=range(classes)))
    return m


def test_multiclass_metrics_match_sklearn():
    targets, probabilities = _predictions()
    m = _check_against_sklearn(targets, probabilities)
    normalized = sk.confusion_matrix(targets, probabilities.argmax(1), normalize="true")
    np.testing.assert_allclose(m["confusion_matrix"]["normalized"], normalized, atol=1e-6)
    assert m["majority_baseline"]["class"] == "3"  # the most frequent class of _predictions
    assert m["majority_baseline"]["accuracy"] == pytest.approx(np.mean(targets == 3))
    assert "roc_auc" not in m  # binary only


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_absent_and_never_predicted_classes_follow_sklearn_zero_division():
    targets = np.array([0, 0, 1, 1, 1, 0, 1, 0])
    probabilities = np.zeros((8, 3))
    probabilities[np.arange(8), [0, 1, 1, 2, 1, 0, 2, 0]] = 1.0  # class 2 predicted but absent from targets
    m = _check_against_sklearn(targets, probabilities)
    assert m["per_class"][2]["support"] == 0 and m["per_class"][2]["predicted"] == 2
    assert m["balanced_accuracy"] == pytest.approx(sk.balanced_accuracy_score(targets, probabilities.argmax(1)))


def test_binary_auc_and_calibration_error_match_sklearn():
    targets, probabilities = _predictions(n=500, classes=2, seed=3, skill=1.0)
    m = _check_against_sklearn(targets, probabilities)
    assert m["roc_auc"] == pytest.approx(sk.roc_auc_score(targets, probabilities[:, 1]))
    assert m["pr_auc"] == pytest.approx(sk.average_precision_score(targets, probabilities[:, 1]))
    # ECE from sklearn's reliability curve over the top-label confidence
    confidence = probabilities.max(1)
    correct = probabilities.argmax(1) == targets
    accuracy_in_bin, confidence_in_bin = calibration_curve(correct, confidence, n_bins=15)
    counts = np.histogram(confidence, bins=np.linspace(0, 1, 16))[0]
    expected = np.sum(counts[counts > 0] / len(targets) * np.abs(accuracy_in_bin - confidence_in_bin))
    assert m["ece"] == pytest.approx(expected)
    assert sum(b["count"] for b in m["calibration_bins"]) == len(targets)


def test_perfectly_calibrated_confident_model_has_zero_ece():
    targets = np.array([0, 1, 1, 0])
    m = classification_metrics(targets, np.eye(2)[targets])
    assert m["ece"] == pytest.approx(0.0) and m["accuracy"] == 1.0


def test_auc_is_undefined_when_one_class_is_missing():
    m = classification_metrics(np.zeros(5, dtype=int), np.tile([0.7, 0.3], (5, 1)))
    assert m["roc_auc"] is None and "undefined" in m["auc_note"]


def test_regression_metrics_match_sklearn():
    rng = np.random.default_rng(1)
    targets = rng.normal(size=200)
    predictions = targets + rng.normal(scale=0.3, size=200)
    m = regression_metrics(targets, predictions[:, None])
    assert m["mae"] == pytest.approx(sk.mean_absolute_error(targets, predictions))
    assert m["rmse"] == pytest.approx(sk.root_mean_squared_error(targets, predictions))
    assert m["r2"] == pytest.approx(sk.r2_score(targets, predictions))
    assert m["mean_baseline"]["rmse"] == pytest.approx(np.std(targets))


def test_ranking_metrics_match_sklearn():
    rng = np.random.default_rng(2)
    n, items = 300, 20
    targets = rng.integers(0, items, size=n)
    scores = rng.normal(size=(n, items))
    scores[np.arange(n), targets] += 1.0
    relevance = np.eye(items)[targets]
    m = ranking_metrics(targets, scores, cutoffs=(1, 5, 10))
    for k in (1, 5, 10):
        assert m[f"hr@{k}"] == pytest.approx(sk.top_k_accuracy_score(targets, scores, k=k, labels=range(items)))
        assert m[f"ndcg@{k}"] == pytest.approx(sk.ndcg_score(relevance, scores, k=k))
    # with one relevant item, label-ranking average precision is the reciprocal rank
    assert m["mrr"] == pytest.approx(sk.label_ranking_average_precision_score(relevance, scores))
    assert m["random_baseline"]["hr@5"] == pytest.approx(5 / items)
