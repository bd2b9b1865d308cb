"""Is a variant's change real or seed noise? Mean ± std per variant, delta vs baseline, and a paired test.

Variant seed k and baseline seed k share their seed (the same initialisation, data order and split), so the
runs are compared in pairs: the test looks at the per-seed differences, which removes the seed-to-seed
spread the two share. Up to `EXACT_MAX_PAIRS` pairs the exact sign-flip permutation test decides (every
assignment of signs to the differences, no assumption about their distribution); beyond that, the paired
t-test (scipy.stats.ttest_rel). Both p-values are reported; `test_used` names the one behind the verdict.
With n pairs the exact test's smallest possible p is 2 / 2**n: 3 seeds cannot show a difference at 0.05
(0.25 at best), 6 can (0.031); the verdict then also says what the t-tests find, which can reach 0.05 with 3
seeds by assuming normally distributed seed noise. Welch's unpaired t-test (scipy.stats.ttest_ind,
equal_var=False) is reported beside them for designs where seed k of two variants shares nothing (a recommender's
seeds on one fixed log). "Within noise" means "not shown to differ", not "shown to be equal".
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Literal

import numpy as np

ALPHA = 0.05
EXACT_MAX_PAIRS = 10  # 2**10 sign assignments: enumerated in milliseconds
EXACT = "exact sign-flip permutation test"
PAIRED_T = "paired t-test"
TEST_NAME = (f"paired by seed (variant seed k vs baseline seed k): {EXACT} on the per-seed differences for up "
             f"to {EXACT_MAX_PAIRS} pairs, {PAIRED_T} (scipy.stats.ttest_rel) beyond; two-sided, alpha {ALPHA}")


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    if not values:
        return None, None
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def paired_t_p_value(variant: list[float], baseline: list[float]) -> float | None:
    """Two-sided p of the paired t-test (scipy.stats.ttest_rel), seed k against seed k; None under 2 pairs."""
    from scipy.stats import ttest_rel

    d = np.asarray(variant, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if len(d) < 2:
        return None
    if np.ptp(d) == 0:  # every pair differs by the same amount: no spread, the t statistic is undefined
        return 1.0 if d[0] == 0 else 0.0
    return float(ttest_rel(variant, baseline).pvalue)


def welch_p_value(variant: list[float], baseline: list[float]) -> float | None:
    """Two-sided p of Welch's unpaired t-test; None under 2 runs on either side."""
    from scipy.stats import ttest_ind

    if len(variant) < 2 or len(baseline) < 2:
        return None
    if np.ptp(variant) == 0 and np.ptp(baseline) == 0:  # no spread on either side: t is undefined
        return 1.0 if variant[0] == baseline[0] else 0.0
    return float(ttest_ind(variant, baseline, equal_var=False).pvalue)


def sign_flip_p_value(differences: list[float]) -> float | None:
    """Exact two-sided p: the share of the 2**n sign assignments whose mean difference is at least as far
    from 0 as the observed one. None without pairs."""
    d = np.asarray(differences, dtype=np.float64)
    if not len(d):
        return None
    observed = abs(d.mean())
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    means = np.abs(signs @ d) / len(d)
    return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


def smallest_exact_p(pairs: int) -> float:
    return 2.0 / 2**pairs if pairs else 1.0


def summarise_variants(names: list[str], outcomes: list[dict[str, Any]], *,
                       goal: Literal["min", "max"]) -> dict[str, Any]:
    """Per variant (the first is the baseline): values, mean ± std, delta, paired p-values and a verdict.
    Outcomes carry "variant", "ok", "value" and "seed" (pairs are made on the seed)."""
    baseline = names[0]
    values = {name: [o["value"] for o in outcomes if o["variant"] == name and o.get("value") is not None]
              for name in names}
    by_seed = {name: {o.get("seed", i): o["value"] for i, o in enumerate(
        [o for o in outcomes if o["variant"] == name and o.get("value") is not None])} for name in names}
    failed = {name: sum(1 for o in outcomes if o["variant"] == name and not o["ok"]) for name in names}
    base_mean, _ = mean_std(values[baseline])
    rows = []
    for name in names:
        mean, std = mean_std(values[name])
        row: dict[str, Any] = {"name": name, "values": values[name], "n": len(values[name]), "mean": mean,
                               "std": std, "failed_runs": failed[name]}
        if name == baseline:
            row.update(delta=None, pairs=None, p_value=None, p_paired_t=None, p_exact=None, p_welch=None,
                       test_used=None, within_noise=None, verdict="baseline")
        else:
            seeds = sorted(set(by_seed[name]) & set(by_seed[baseline]))
            pair_a, pair_b = [by_seed[name][s] for s in seeds], [by_seed[baseline][s] for s in seeds]
            differences = [a - b for a, b in zip(pair_a, pair_b)]
            delta = None if mean is None or base_mean is None else mean - base_mean
            p_t, p_exact = paired_t_p_value(pair_a, pair_b), sign_flip_p_value(differences)
            exact = len(differences) <= EXACT_MAX_PAIRS
            p = p_exact if exact else p_t
            if len(differences) < 2:
                p = None
            within = None if p is None else p >= ALPHA
            p_welch = welch_p_value(values[name], values[baseline])
            row.update(delta=delta, pairs=len(differences), p_value=p, p_paired_t=p_t, p_exact=p_exact,
                       p_welch=p_welch, test_used=(EXACT if exact else PAIRED_T) if p is not None else None,
                       within_noise=within, verdict=_verdict(delta, within, goal, len(differences), exact,
                                                             t_tests=(p_t, p_welch)))
        rows.append(row)
    return {"test": TEST_NAME, "alpha": ALPHA, "variants": rows}


def _verdict(delta: float | None, within_noise: bool | None, goal: str, pairs: int, exact: bool,
             t_tests: tuple[float | None, float | None] = (None, None)) -> str:
    if delta is None:
        return "no successful runs"
    if within_noise is None:
        return "too few seeds to tell (need 2+ seeds that ran for both the baseline and the variant)"
    if within_noise and exact and smallest_exact_p(pairs) >= ALPHA and not math.isclose(delta, 0.0, abs_tol=1e-12):
        paired, welch = t_tests
        assuming = ""
        if paired is not None and welch is not None:
            shown = "a difference" if min(paired, welch) < ALPHA else "no difference"
            assuming = (f"; assuming normally distributed seed noise, the t-tests show {shown} (paired p = "
                        f"{paired:.2g}, Welch p = {welch:.2g})")
        return (f"too few seeds to tell without assumptions: with {pairs} paired seeds the exact test's smallest p "
                f"is {smallest_exact_p(pairs):.3g}; use --seeds 6 or more{assuming}")
    if within_noise or math.isclose(delta, 0.0, abs_tol=1e-12):
        return "within seed noise"
    better = delta < 0 if goal == "min" else delta > 0
    return "better than baseline" if better else "worse than baseline"
