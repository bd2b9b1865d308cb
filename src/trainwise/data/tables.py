"""Tables: CSV or Parquet with a label column → float32 features, categorical columns one-hot encoded.

Everything learned from the data (categories, fill values, normalisation statistics) comes from the
training split only, so nothing about validation or test rows leaks into the features.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainwise.errors import DataError

TABLE_SUFFIXES = (".csv", ".tsv", ".parquet", ".pq")
LABEL_NAMES = ("label", "target", "y", "class")
MAX_CATEGORIES = 32  # one-hot columns per categorical feature; rarer values share an "other" column
MAX_CLASSES = 100


def read_columns(path: Path) -> dict[str, np.ndarray]:
    """Column name → values. Numbers come back numeric (NaN for blanks), anything else as object strings."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        if path.suffix.lower() in (".parquet", ".pq"):
            raise DataError(f"{path}: reading Parquet needs pyarrow: pip install pyarrow") from None
        return _read_csv_module(path)
    return _read_pyarrow(path)


def _read_pyarrow(path: Path) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            table = pq.read_table(path)
        else:
            delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
            table = pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=delimiter))
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{path}: cannot read the table ({e}).") from None
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type):
            columns[name] = column.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls → NaN
        else:
            values = column.cast(pa.string()).to_pylist()
            columns[name] = np.array([None if v in (None, "") else v for v in values], dtype=object)
    return columns


def _read_csv_module(path: Path) -> dict[str, np.ndarray]:
    with open(path, newline="") as f:
        reader = csv.reader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        header = next(reader, None)
        if not header:
            raise DataError(f"{path}: empty file; a table needs a header row.")
        rows = list(reader)
    columns = {}
    for i, name in enumerate(header):
        values = [row[i].strip() if i < len(row) and row[i].strip() else None for row in rows]
        try:
            columns[name] = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
        except ValueError:
            columns[name] = np.array(values, dtype=object)
    return columns


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
    """classification for text labels or few whole numbers; regression for other numbers."""
    if task != "auto":
        return task
    if values.dtype == object:
        return "classification"
    whole = np.all(values == np.round(values))
    return "classification" if whole and len(np.unique(values)) <= MAX_CLASSES else "regression"


def encode_labels(values: np.ndarray, task: str) -> tuple[np.ndarray, list[str] | None]:
    if task == "regression":
        if values.dtype == object:
            raise DataError("--task regression needs a numeric label column.")
        return values.astype(np.float32), None
    as_text = np.array([_label_text(v) for v in values], dtype=object)
    names = sorted(set(as_text), key=_natural_key)
    lookup = {name: i for i, name in enumerate(names)}
    return np.array([lookup[v] for v in as_text], dtype=np.int64), names


def _label_text(value: Any) -> str:
    if isinstance(value, float) and value == int(value):
        return str(int(value))
    return str(value)


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
    std = features.std(axis=0)
    return {"mean": features.mean(axis=0).tolist(), "std": np.where(std > 0, std, 1.0).tolist()}
