"""Is a variant's change real or seed noise? Mean ± std per variant, delta vs baseline, Welch's t-test.

Welch's t-test (scipy.stats.ttest_ind with equal_var=False) does not assume the variants vary equally
across seeds. With 3 seeds it only detects large effects: "within noise" means "not shown to differ",
not "shown to be equal".
"""
from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

ALPHA = 0.05
TEST_NAME = f"Welch's t-test (scipy.stats.ttest_ind, equal_var=False), two-sided, alpha {ALPHA}"


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    if not values:
        return None, None
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def welch_p_value(a: list[float], b: list[float]) -> float | None:
    """Two-sided p-value that `a` and `b` have the same mean; None when either has under 2 values."""
    from scipy.stats import ttest_ind

    if len(a) < 2 or len(b) < 2:
        return None
    if np.std(a) == 0 and np.std(b) == 0:  # no seed variance at all: the t statistic is undefined
        return 1.0 if np.mean(a) == np.mean(b) else 0.0
    return float(ttest_ind(a, b, equal_var=False).pvalue)


def summarise_variants(names: list[str], outcomes: list[dict[str, Any]], *,
                       goal: Literal["min", "max"]) -> dict[str, Any]:
    """Per variant (the first is the baseline): values, mean ± std, delta, p-value and a verdict."""
    values = {name: [o["value"] for o in outcomes if o["variant"] == name and o.get("value") is not None]
              for name in names}
    failed = {name: sum(1 for o in outcomes if o["variant"] == name and not o["ok"]) for name in names}
    baseline = names[0]
    base_mean, _ = mean_std(values[baseline])
    rows = []
    for name in names:
        mean, std = mean_std(values[name])
        row: dict[str, Any] = {"name": name, "values": values[name], "n": len(values[name]), "mean": mean,
                               "std": std, "failed_runs": failed[name]}
        if name == baseline:
            row.update(delta=None, p_value=None, within_noise=None, verdict="baseline")
        else:
            delta = None if mean is None or base_mean is None else mean - base_mean
            p = welch_p_value(values[name], values[baseline])
            within = None if p is None else p >= ALPHA
            row.update(delta=delta, p_value=p, within_noise=within, verdict=_verdict(delta, within, goal))
        rows.append(row)
    return {"test": TEST_NAME, "alpha": ALPHA, "variants": rows}


def _verdict(delta: float | None, within_noise: bool | None, goal: str) -> str:
    if delta is None:
        return "no successful runs"
    if within_noise is None:
        return "too few seeds to tell (need 2+ per variant)"
    if within_noise or math.isclose(delta, 0.0, abs_tol=1e-12):
        return "within seed noise"
    better = delta < 0 if goal == "min" else delta > 0
    return "better than baseline" if better else "worse than baseline"
