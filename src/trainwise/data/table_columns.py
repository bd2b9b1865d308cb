"""What each column of a table is, before it becomes features: numbers or categories, and which cells count
as missing.

A column that is mostly numbers with some text ("n/a", "unknown", "?") is read as categories by default,
which turns every distinct number into its own one-hot column: prepare says so and offers the choice
(--numeric NAME reads the text cells as missing; --categorical NAME keeps the categories, quietly). A cell
that is infinite, or too large for float32, would turn its column's fill value and statistics into inf and
every row NaN once normalised: it is treated as missing, and named.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from trainwise.errors import DataError

FLOAT32_MAX = float(np.finfo(np.float32).max)  # features are stored as float32
MIXED_NUMBER_SHARE = 0.5  # a text column whose values are more than this share numbers is probably numeric
SHOWN = 3  # cells or values quoted in a message


def column_names(text: str | None, flag: str, columns: dict[str, np.ndarray], label: str, path: Path) -> list[str]:
    """`a,b` from --numeric/--categorical → the names, each a feature column of the table."""
    names = [name.strip() for name in (text or "").split(",") if name.strip()]
    for name in names:
        if name == label:
            raise DataError(f"{flag} {name}: that is the label column; {flag} names feature columns.")
        if name not in columns:
            raise DataError(f"{flag} {name}: {path} has no column {name!r}; columns: {', '.join(columns)}.")
    return names


def choose_column_types(columns: dict[str, np.ndarray], label: str, path: Path, *, numeric: str | None = None,
                        categorical: str | None = None) -> tuple[dict[str, np.ndarray], list[str]]:
    """The columns with the user's --numeric and --categorical choices applied, and notes: what --numeric
    turned into missing cells, and each mixed column left to its default (categories) with the choice."""
    as_numbers = column_names(numeric, "--numeric", columns, label, path)
    as_categories = column_names(categorical, "--categorical", columns, label, path)
    both = sorted(set(as_numbers) & set(as_categories))
    if both:
        raise DataError(f"--numeric and --categorical both name {', '.join(both)}; choose one for each column.")
    typed, notes = dict(columns), []
    for name in as_numbers:
        typed[name], text = numbers(columns[name])
        if text:
            notes.append(f"column {name!r}: {len(text)} text cells read as missing (--numeric), e.g. "
                         f"{_quoted(text)}.")
    for name in as_categories:
        typed[name] = categories(columns[name])
    for name, values in columns.items():
        if name != label and name not in as_numbers and name not in as_categories:
            note = mixed_column_note(name, values)
            notes += [note] if note else []
    return typed, notes


def numbers(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """A column as float64 (blanks and text → NaN), and the text cells that were not numbers."""
    if values.dtype != object:
        return values.astype(np.float64), []
    out, text = np.full(len(values), np.nan), []
    for i, value in enumerate(values):
        if value is not None:
            number = _number(value)
            if number is None:
                text.append(value)
            else:
                out[i] = number
    return out, text


def categories(values: np.ndarray) -> np.ndarray:
    """A column as category names (whole numbers without `.0`), blanks as None."""
    if values.dtype == object:
        return values
    return np.array([None if np.isnan(v) else category_name(v) for v in values], dtype=object)


def category_name(value) -> str:
    """How a value reads as a class or category name: 3.0 → "3", 2.5 → "2.5", text as it is."""
    if isinstance(value, (float, np.floating)) and np.isfinite(value) and value == int(value):
        return str(int(value))
    return str(value)


def mixed_column_note(name: str, values: np.ndarray) -> str | None:
    """A warning for a text column most of whose values are numbers; None for any other column."""
    if values.dtype != object:
        return None
    present = [v for v in values if v is not None]
    text = [v for v in present if _number(v) is None]
    count = len(present) - len(text)
    if not text or count <= MIXED_NUMBER_SHARE * len(present):
        return None
    distinct = len(set(present))
    return (f"column {name!r}: {count} of {len(present)} values are numbers but {len(text)} are text (e.g. "
            f"{_quoted(text)}), so it is read as categories ({distinct} distinct values: the most frequent become "
            f"one-hot columns, the rest {name}=<other>). To read it as numbers, with the text cells as missing: "
            f"--numeric {name}. To keep it as categories and silence this: --categorical {name}.")


def non_finite_to_missing(columns: dict[str, np.ndarray], label: str) -> list[str]:
    """Turn infinite cells, and numbers too large for float32, of the feature columns into NaN (missing, so
    filled with the training mean), in place; a note per column naming the first cells (1-based data rows)."""
    notes = []
    for name, values in columns.items():
        if name == label or values.dtype == object:
            continue
        bad = np.flatnonzero(np.abs(np.nan_to_num(values, nan=0.0)) > FLOAT32_MAX)
        if len(bad):
            cells = ", ".join(f"row {i + 1}: {values[i]:g}" for i in bad[:SHOWN])
            more = f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
            values[bad] = np.nan
            some = "1 cell is" if len(bad) == 1 else f"{len(bad)} cells are"
            notes.append(f"column {name!r}: {some} infinite or too large for float32 ({cells}{more}); "
                         "treated as missing (filled with the training mean). Fix them in the source if they are "
                         "errors.")
    return notes


def check_finite_labels(values: np.ndarray, label: str, path: Path) -> None:
    """Refuse a numeric label that is infinite or too large for float32, naming the rows."""
    if values.dtype == object:
        return
    bad = np.flatnonzero(np.abs(np.nan_to_num(values, nan=0.0)) > FLOAT32_MAX)
    if len(bad):
        rows = ", ".join(f"row {i + 1}: {values[i]:g}" for i in bad[:SHOWN])
        more = f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        some = "a value that is not a finite number" if len(bad) == 1 else f"{len(bad)} values that are not finite numbers"
        raise DataError(f"{path}: label column {label!r} holds {some} ({rows}{more}; rows counted from 1 after the "
                        "header). Fix it, or blank the label (rows without a label are skipped).")


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _quoted(values: list[str]) -> str:
    shown = list(dict.fromkeys(values))[:SHOWN]
    return ", ".join(repr(v) for v in shown)
