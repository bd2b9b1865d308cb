"""Tables: CSV or Parquet with a label column → float32 features, categorical columns one-hot encoded.

Everything learned from the data (categories, fill values, normalisation statistics) comes from the
training split only, so nothing about validation or test rows leaks into the features.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainwise.data.table_columns import (category_name, check_finite_labels, choose_column_types,
                                          non_finite_to_missing)
from trainwise.data.table_files import TableFile
from trainwise.errors import DataError

TABLE_SUFFIXES = (".csv", ".tsv", ".parquet", ".pq")
LABEL_NAMES = ("label", "target", "y", "class")
MAX_CATEGORIES = 32  # one-hot columns per categorical feature; rarer values share an "other" column
MAX_CLASSES = 100
FEW_CLASSES = 10  # whole-number labels with at most this many distinct values are classes
MIN_ROWS_PER_CLASS = 5  # ...or up to MAX_CLASSES of them, when each has this many rows on average


def find_column(columns: dict[str, np.ndarray], given: str | None, names: tuple[str, ...], role: str,
                path: Path, flag: str) -> str:
    """The column playing `role`: the one the user named, else the first whose name is a usual one."""
    if given:
        if given not in columns:
            raise DataError(f"{path}: no {role} column {given!r}; columns: {', '.join(columns)}.")
        return given
    for name in columns:
        if name.lower() in names:
            return name
    raise DataError(f"{path}: which column is the {role}? None is called {'/'.join(names)}; "
                    f"pass {flag} NAME (columns: {', '.join(columns)}).")


def find_label(columns: dict[str, np.ndarray], label: str | None, path: Path) -> str:
    return find_column(columns, label, LABEL_NAMES, "label", path, "--label")


def choose_task(values: np.ndarray, task: str) -> str:
    """classification for text labels, and for whole numbers with few distinct values (at most
    FEW_CLASSES, or at most MAX_CLASSES with MIN_ROWS_PER_CLASS rows each on average); else regression."""
    if task != "auto":
        return task
    if values.dtype == object:
        return "classification"
    distinct = len(np.unique(values))
    few = distinct <= FEW_CLASSES or (distinct <= MAX_CLASSES and len(values) >= MIN_ROWS_PER_CLASS * distinct)
    return "classification" if few and np.all(values == np.round(values)) else "regression"


def task_note(values: np.ndarray, given: str, task: str, class_names: list[str] | None) -> str:
    """The line prepare prints about the task: which, why (when it chose), and the flag that picks the other."""
    if given != "auto":
        return f"task: {task} (--task {given})" + (f", {len(class_names)} classes." if class_names else ".")
    if task == "regression":
        distinct = len(np.unique(values))
        why = ("fractional numbers" if not np.all(values == np.round(values)) else
               f"whole numbers with {distinct} distinct values, too many to be classes")
        return (f"task: regression (the labels are {why}). If they are classes, pass --task classification.")
    if values.dtype == object:
        return f"task: classification, {len(class_names or [])} classes (the labels are text)."
    return (f"task: classification, {len(class_names or [])} classes (the labels are whole numbers with few "
            "distinct values). If they are quantities (counts, scores, prices), pass --task regression.")


def encode_labels(values: np.ndarray, task: str) -> tuple[np.ndarray, list[str] | None]:
    if task == "regression":
        if values.dtype == object:
            raise DataError("--task regression needs a numeric label column.")
        return values.astype(np.float32), None
    as_text = np.array([category_name(v) for v in values], dtype=object)
    names = sorted(set(as_text), key=_natural_key)
    lookup = {name: i for i, name in enumerate(names)}
    return np.array([lookup[v] for v in as_text], dtype=np.int64), names


def check_classes(class_names: list[str] | None, label: str, path: Path, rows: int) -> None:
    """A classifier needs two classes to tell apart: refuse a label column with one value."""
    if class_names is not None and len(class_names) < 2:
        raise DataError(f"{path}: label column {label!r} holds one class ({class_names[0]!r}) in all {rows:,} "
                        "rows with a label; a classifier needs at least two to tell apart. Check that this is "
                        "the label (--label NAME picks another column), or add rows of the other classes.")


def check_features(columns: dict[str, np.ndarray], label: str, path: Path) -> None:
    if not columns:
        raise DataError(f"{path}: no feature columns: the table has only the label column {label!r}. A model "
                        "needs at least one column to predict it from.")


def _natural_key(name: str):
    try:
        return (0, float(name), name)
    except ValueError:
        return (1, 0.0, name)


def missing_labels(values: np.ndarray) -> np.ndarray:
    if values.dtype == object:
        return np.array([v is None for v in values], dtype=bool)
    return np.isnan(values)


@dataclass
class LabelledTable:
    """A table's feature columns and encoded labels, the rows kept (those with a label), and what prepare
    says about them: `notes` (how it was read, the task chosen) and `warnings` (cells and columns it changed
    or left to a default the user may not want)."""

    features: dict[str, np.ndarray]
    targets: np.ndarray
    task: str
    class_names: list[str] | None
    label: str
    unlabelled: np.ndarray  # bool per source row: no label, skipped
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def label_table(table: TableFile, path: Path, *, label: str | None = None, task: str = "auto",
                numeric: str | None = None, categorical: str | None = None) -> LabelledTable:
    """Find the label, type the feature columns (--numeric/--categorical), clear non-finite cells, drop the
    rows without a label, choose the task and encode the labels; refuse what cannot be trained on."""
    columns = table.columns
    label = find_label(columns, label, path)
    columns, warnings = choose_column_types(columns, label, path, numeric=numeric, categorical=categorical)
    warnings += non_finite_to_missing(columns, label)
    check_finite_labels(columns[label], label, path)
    unlabelled = missing_labels(columns[label])
    columns = {name: values[~unlabelled] for name, values in columns.items()}
    if not len(columns[label]):
        raise DataError(f"{path}: no rows with a label in column {label!r}.")
    values = columns.pop(label)
    check_features(columns, label, path)
    chosen = choose_task(values, task)
    targets, class_names = encode_labels(values, chosen)
    if chosen == "classification":
        check_classes(class_names, label, path, len(targets))
    notes = [*table.notes, task_note(values, task, chosen, class_names)]
    return LabelledTable(columns, targets, chosen, class_names, label, unlabelled, notes, warnings)


@dataclass
class TableEncoder:
    """How raw columns become float32 features; fitted on the training rows only."""

    numeric: list[str] = field(default_factory=list)
    fill: dict[str, float] = field(default_factory=dict)            # train mean, for blanks
    categories: dict[str, list[str]] = field(default_factory=dict)  # train categories per column

    @classmethod
    def fit(cls, columns: dict[str, np.ndarray], rows: np.ndarray) -> "TableEncoder":
        encoder = cls()
        for name, values in columns.items():
            train = values[rows]
            if values.dtype != object:
                encoder.numeric.append(name)
                mean = np.nanmean(train) if np.any(~np.isnan(train)) else 0.0
                encoder.fill[name] = float(mean)
            else:
                present = [v for v in train if v is not None]
                kinds, counts = np.unique(np.array(present, dtype=str), return_counts=True) if present else ([], [])
                order = np.argsort(-np.asarray(counts), kind="stable")
                encoder.categories[name] = [str(kinds[i]) for i in order[:MAX_CATEGORIES]]
        return encoder

    @property
    def feature_names(self) -> list[str]:
        names = list(self.numeric)
        for column, kinds in self.categories.items():
            names += [f"{column}={kind}" for kind in kinds] + [f"{column}=<other>"]
        return names

    def transform(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """Numeric columns (blanks → train mean), then one-hot blocks; unseen or blank categories → <other>."""
        n = len(next(iter(columns.values())))
        parts = []
        for name in self.numeric:
            values = columns[name].astype(np.float64)
            parts.append(np.where(np.isnan(values), self.fill[name], values)[:, None])
        for name, kinds in self.categories.items():
            lookup = {kind: i for i, kind in enumerate(kinds)}
            index = np.array([lookup.get(v, len(kinds)) if v is not None else len(kinds)
                              for v in columns[name]], dtype=np.int64)
            parts.append(np.eye(len(kinds) + 1, dtype=np.float32)[index])
        return np.concatenate(parts, axis=1).astype(np.float32) if parts else np.zeros((n, 0), np.float32)

    def to_json(self) -> dict[str, Any]:
        return {"numeric": self.numeric, "fill": self.fill, "categories": self.categories}


def feature_stats(features: np.ndarray) -> dict[str, list[float]]:
    """Per-feature mean and std of the training rows (the loader normalises with these)."""
    wide = features.astype(np.float64)  # float32 sums of large values overflow
    std = wide.std(axis=0)
    return {"mean": wide.mean(axis=0).tolist(), "std": np.where(std > 0, std, 1.0).tolist()}
