"""The calibration verdict, read from constructed reliability bins with the thresholds it states."""
import numpy as np

from trainwise.evaluate.calibration import HIGH_CONFIDENCE, WELL_CALIBRATED_ECE, calibration_verdict
from trainwise.evaluate.metrics import classification_metrics


def _bin(lower, count, confidence, accuracy):
    return {"lower": lower, "upper": lower + 0.1, "count": count, "confidence": confidence, "accuracy": accuracy}


def _ece(bins):
    total = sum(b["count"] for b in bins)
    return sum(b["count"] / total * abs(b["accuracy"] - b["confidence"]) for b in bins)


def test_over_confident_when_the_high_bins_are_less_accurate_than_they_claim():
    bins = [_bin(0.5, 20, 0.55, 0.5), _bin(0.9, 80, 0.95, 0.7)]
    verdict, line = calibration_verdict(bins, _ece(bins))
    assert verdict == "over_confident"
    assert line.startswith("over-confident: accuracy below confidence in the high bins")
    assert "mean confidence 0.950, accuracy 0.700" in line and f"> {WELL_CALIBRATED_ECE}" in line


def test_under_confident_when_the_high_bins_are_more_accurate():
    bins = [_bin(0.7, 100, 0.75, 0.98)]
    verdict, line = calibration_verdict(bins, _ece(bins))
    assert verdict == "under_confident" and "accuracy above confidence" in line


def test_well_calibrated_below_the_threshold():
    bins = [_bin(0.6, 50, 0.65, 0.64), _bin(0.9, 50, 0.95, 0.96)]
    verdict, line = calibration_verdict(bins, _ece(bins))
    assert verdict == "well_calibrated" and f"≤ {WELL_CALIBRATED_ECE}" in line


def test_errors_that_cancel_in_the_high_bins_are_called_mixed():
    bins = [_bin(HIGH_CONFIDENCE, 50, 0.75, 0.95), _bin(0.9, 50, 0.95, 0.75)]
    assert calibration_verdict(bins, _ece(bins))[0] == "mixed"


def test_too_few_samples_is_not_judged():
    bins = [_bin(0.9, 10, 0.95, 0.5)]
    verdict, line = calibration_verdict(bins, _ece(bins))
    assert verdict == "too_few_samples" and "10" in line


def test_verdict_on_metrics_bins_of_a_confident_wrong_model():
    targets = np.array([0, 1] * 100)
    probabilities = np.tile([0.95, 0.05], (200, 1))  # always 95% sure of class 0; right half the time
    m = classification_metrics(targets, probabilities, ["a", "b"])
    assert calibration_verdict(m["calibration_bins"], m["ece"])[0] == "over_confident"
