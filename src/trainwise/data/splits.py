"""Seeded train/val/test assignment for images and tables: stratified by class for classification, so a
rare class shows up in every split; random for regression. (Interactions split by time, see interactions.py.)"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from trainwise.data.prepare_options import PrepareOptions


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


def empty_split_warnings(splits: dict[str, dict], options: "PrepareOptions") -> list[str]:
    """A warning for each held-out split that came out empty although the options asked for one: without
    validation, train cannot pick a best checkpoint or stop early; without test, eval has nothing held out.
    Text splits count tokens, but are split by document (or conversation): their entries say so (`unit`), and
    the warning counts what was split."""
    unit = next((entry["unit"] for entry in splits.values() if entry.get("unit")), "samples")
    total = sum(entry.get("documents", entry["count"]) if unit != "samples" else entry["count"]
                for entry in splits.values())
    last_k = options.kind == "interactions" and options.split == "last-k"
    found = []
    for split, name, fraction, cost in (
            ("val", "validation", options.val_fraction, "train cannot pick a best checkpoint or stop early"),
            ("test", "test", options.test_fraction, "`trainwise eval` has no held-out split to measure")):
        if splits.get(split, {}).get("count", 0) or (not last_k and fraction <= 0):
            continue
        if last_k and options.last_k == 0:
            why, fix = "--last-k 0 holds out no events", "use --last-k 1 or more"
        elif last_k:
            why = f"no user has more than {2 * options.last_k} events (2 x --last-k), so every history stays whole"
            fix = "use a smaller --last-k, or --split time"
        elif unit == "parts of one document":
            why = "the source is one document, cut by position, and it is too short to leave a part for it"
            fix = "give more text (or several documents)"
        else:
            why = f"{fraction:g} of {total:,} {unit} rounds to none"
            fix = f"give more data or a larger --{'val' if split == 'val' else 'test'}-fraction"
        found.append(f"the {name} split is empty: {why}; {cost}. To have one, {fix}.")
    return found
