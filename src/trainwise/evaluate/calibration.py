"""Reading a reliability table: is the model over-confident, under-confident or well calibrated?

The table is metrics.calibration's: equal-width bins of top-label confidence, each with its sample count,
mean confidence and accuracy. The verdict is a pure function of those bins, so the report and a test on
constructed bins give the same answer.
"""
from __future__ import annotations

from typing import Any

WELL_CALIBRATED_ECE = 0.05
"""ECE at or below this: well calibrated (confidence within ~5 points of accuracy on average)."""
HIGH_CONFIDENCE = 0.7
"""The 'high bins': mean confidence at or above this. Decisions are taken there, so the verdict reads them."""
MIN_SAMPLES = 30
"""Fewer evaluated samples than this: too few to judge calibration."""


def calibration_verdict(bins: list[dict[str, Any]], ece: float) -> tuple[str, str]:
    """(verdict, one line a person reads). verdict is one of well_calibrated, over_confident,
    under_confident, mixed, too_few_samples."""
    total = sum(b["count"] for b in bins)
    if total < MIN_SAMPLES:
        return "too_few_samples", (f"too few samples to judge calibration ({total}; at least {MIN_SAMPLES} "
                                   "needed): evaluate a larger split.")
    if ece <= WELL_CALIBRATED_ECE:
        return "well_calibrated", (f"well calibrated: ECE {ece:.3f} ≤ {WELL_CALIBRATED_ECE} — confidence "
                                   "matches accuracy.")
    high = [b for b in bins if b["confidence"] >= HIGH_CONFIDENCE] or bins
    where = f"confidence ≥ {HIGH_CONFIDENCE}" if high is not bins else "all bins"
    count = sum(b["count"] for b in high)
    confidence = sum(b["count"] * b["confidence"] for b in high) / count
    accuracy = sum(b["count"] * b["accuracy"] for b in high) / count
    gap = confidence - accuracy
    numbers = (f"({where}, {count} samples: mean confidence {confidence:.3f}, accuracy {accuracy:.3f}); "
               f"ECE {ece:.3f} > {WELL_CALIBRATED_ECE}")
    if abs(gap) < ece / 2:  # the high bins are near the diagonal: the error is elsewhere, or both ways
        return "mixed", f"miscalibrated, though near the diagonal in the high bins {numbers}."
    if gap > 0:
        return "over_confident", f"over-confident: accuracy below confidence in the high bins {numbers}."
    return "under_confident", f"under-confident: accuracy above confidence in the high bins {numbers}."
