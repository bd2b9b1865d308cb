"""Seeded train/val/test assignment for images and tables: stratified by class for classification, so a
rare class shows up in every split; random for regression. (Interactions split by time, see interactions.py.)"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from trainwise.data.prepare import PrepareOptions


def split_codes(labels: np.ndarray | None, n: int, options: "PrepareOptions") -> np.ndarray:
    """0 train / 1 val / 2 test per sample: stratified by label when given (classification), else random."""
    from sklearn.model_selection import train_test_split

    codes = np.zeros(n, dtype=np.int8)
    rest = np.arange(n)
    for code, fraction, seed in ((2, options.test_fraction, options.seed),
                                 (1, options.val_fraction, options.seed + 1)):
        if fraction <= 0:
            continue
        share = fraction / (1 - (options.test_fraction if code == 1 else 0.0))
        strata = labels[rest] if labels is not None else None
        if strata is not None:
            _, counts = np.unique(strata, return_counts=True)
            if counts.min() < 2 or len(counts) > round(share * len(rest)):
                # a class of one sample, or fewer held-out samples than classes: cannot stratify
                strata = None
        if round(share * len(rest)) < 1:
            continue
        rest, held = train_test_split(rest, test_size=share, random_state=seed, stratify=strata)
        codes[held] = code
    return codes
