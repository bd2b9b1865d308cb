"""Interactions (user, item, timestamp[, rating, ...]): dense ids, each user's history in time order, and a
split by time so that no user's future ends up in training.

Two leak-free splits:
- `time`: one global cut-off; every training event happens before every validation event, and those
  before every test event (what you would see deploying on a date).
- `last-k`: each user's last k events are test, the k before them validation, the rest training.
A random split would put a user's later clicks into training and let the model "predict" what it saw.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainwise.data.tables import find_column as find_table_column
from trainwise.errors import DataError

USER_NAMES = ("user", "user_id", "userid", "customer_id", "visitorid", "session_id")
ITEM_NAMES = ("item", "item_id", "itemid", "movieid", "product_id", "movie_id")
TIME_NAMES = ("timestamp", "time", "ts", "event_time", "datetime", "date")
TARGET_NAMES = ("rating", "label", "target", "score")
MOVIELENS_COLUMNS = ("user", "item", "rating", "timestamp")


def read_movielens_dat(path: Path) -> dict[str, np.ndarray]:
    """MovieLens `ratings.dat`: `UserID::MovieID::Rating::Timestamp`, no header."""
    rows = [line.split("::") for line in path.read_text(encoding="latin-1").splitlines() if line.strip()]
    if not rows or any(len(r) != 4 for r in rows):
        raise DataError(f"{path}: expected MovieLens lines `user::item::rating::timestamp`.")
    table = np.array(rows, dtype=object).T
    return {name: table[i].astype(np.float64) for i, name in enumerate(MOVIELENS_COLUMNS)}


def read_recbole_inter(path: Path) -> dict[str, np.ndarray]:
    """RecBole's atomic `.inter` file: tab-separated, header fields typed as `name:token` / `name:float`.
    The types are dropped from the names (`user_id:token` → `user_id`); numeric columns come back float."""
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    if not rows:
        raise DataError(f"{path}: empty file; a RecBole .inter file starts with a typed header such as "
                        "`user_id:token<TAB>item_id:token<TAB>timestamp:float`.")
    names = [field.partition(":")[0].strip() for field in rows[0]]
    if len(set(names)) != len(names):
        raise DataError(f"{path}: the header names a column twice ({', '.join(rows[0])}).")
    body = [r for r in rows[1:] if r]
    if any(len(r) != len(names) for r in body):
        bad = next(i for i, r in enumerate(body, start=2) if len(r) != len(names))
        raise DataError(f"{path}: line {bad} has a different number of fields than the header ({len(names)}).")
    columns = {}
    for index, name in enumerate(names):
        values = np.array([r[index] for r in body], dtype=object)
        try:
            columns[name] = values.astype(np.float64)
        except ValueError:
            columns[name] = values
    return columns


def find_column(columns: dict[str, np.ndarray], given: str | None, names: tuple[str, ...], role: str,
                path: Path) -> str:
    return find_table_column(columns, given, names, role, path, f"--{role}-col")


def looks_like_interactions(columns: dict[str, np.ndarray]) -> bool:
    lowered = {name.lower() for name in columns}
    return all(lowered & set(names) for names in (USER_NAMES, ITEM_NAMES, TIME_NAMES))


def to_timestamps(values: np.ndarray, path: Path) -> np.ndarray:
    """Numbers as they are; text such as `2024-03-01 12:00:00` via numpy datetime64 (seconds)."""
    if values.dtype != object:
        if np.isnan(values).any():
            raise DataError(f"{path}: {int(np.isnan(values).sum())} events have no timestamp; drop or fix them.")
        return values.astype(np.int64)
    try:
        return np.array([str(v).replace(" ", "T").rstrip("Z") for v in values],
                        dtype="datetime64[s]").astype(np.int64)
    except ValueError as e:
        raise DataError(f"{path}: timestamps must be numbers or ISO dates ({e}).") from None


def dense_ids(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Original ids → 0..n-1 (in sorted order of the originals), and the originals by dense id."""
    keys = values.astype(str) if values.dtype == object else values
    originals, dense = np.unique(keys, return_inverse=True)
    if originals.dtype.kind == "f" and np.all(originals == np.round(originals)):
        originals = originals.astype(np.int64)
    return dense.astype(np.int64), originals


@dataclass(frozen=True)
class TimeSplit:
    """Per event, its split code (0 train, 1 val, 2 test), after sorting by (user, time)."""

    order: np.ndarray   # permutation of the source rows: by user, then time, then source order
    split: np.ndarray   # split code per row of `order`


def time_order(users: np.ndarray, times: np.ndarray) -> np.ndarray:
    return np.lexsort((np.arange(len(users)), times, users))


def split_by_time(users: np.ndarray, times: np.ndarray, *, how: str, val_fraction: float,
                  test_fraction: float, last_k: int) -> TimeSplit:
    order = time_order(users, times)
    users, times = users[order], times[order]
    split = np.zeros(len(order), dtype=np.int8)
    if how == "time":
        # cut-offs on the timestamps themselves, so events at the same instant land on the same side
        test_cut = np.quantile(times, 1 - test_fraction, method="higher") if test_fraction else None
        val_cut = np.quantile(times, 1 - test_fraction - val_fraction, method="higher") if val_fraction else None
        if val_cut is not None:
            split[times >= val_cut] = 1
        if test_cut is not None:
            split[times >= test_cut] = 2
    elif how == "last-k":
        # position from the end of each user's (time-sorted) history
        starts = np.r_[0, np.flatnonzero(np.diff(users)) + 1]
        lengths = np.diff(np.r_[starts, len(users)])
        from_end = np.repeat(starts + lengths, lengths) - np.arange(len(users)) - 1
        keep_train = lengths > 2 * last_k  # users too short to split stay whole in training
        eligible = np.repeat(keep_train, lengths)
        split[eligible & (from_end < 2 * last_k)] = 1
        split[eligible & (from_end < last_k)] = 2
    else:
        raise DataError(f"--split {how!r}: use `time` (global cut-off) or `last-k` (each user's last k events).")
    return TimeSplit(order, split)
