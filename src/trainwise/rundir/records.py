"""The append-only JSONL records of a run (metrics, events, system samples): reading them defensively.

A record is one JSON object per line. Readers skip what they cannot use and say where it was, file and
line, instead of failing a report over one bad line: a line that is not JSON, not an object, or whose
fields downstream code relies on have the wrong type (`step` a whole number, `time` a finite number). A
torn last line is what a crash mid-append leaves: it is skipped without a word, and the next writer cuts it
off before appending (`seal`), so it never merges with the next record.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainwise.rundir.atomic import is_disk_full
from trainwise.errors import DiskFullError

Check = Callable[[dict[str, Any]], "str | None"]
_SHOWN = 3  # bad lines named one by one per file; the rest are counted


def read_jsonl(path: Path, check: Check, report: Callable[[str], None]) -> list[dict[str, Any]]:
    """The usable records of `path` (none when it does not exist); `report(message)` for each skipped."""
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    bad: list[tuple[int, str]] = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            torn = not raw.endswith(b"\n")  # only the last line can lack its newline
            try:
                record = json.loads(raw.decode("utf-8"))
            except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
                if not torn:
                    bad.append((number, f"is not JSON ({getattr(error, 'msg', error)})"))
                continue
            problem = "is not a JSON object" if not isinstance(record, dict) else check(record)
            if problem:
                bad.append((number, problem))
                continue
            records.append(record)
    for number, problem in bad[:_SHOWN]:
        report(f"{path}:{number}: line skipped, it {problem}")
    if len(bad) > _SHOWN:
        report(f"{path}: {len(bad) - _SHOWN} more bad lines skipped")
    return records


def metric_problem(record: dict[str, Any]) -> str | None:
    return (_whole(record, "step", required=True) or _text(record, "split") or _number(record, "time")
            or _number(record, "epoch"))


def event_problem(record: dict[str, Any]) -> str | None:
    return (_whole(record, "step", required=False) or _number(record, "time") or _text(record, "kind")
            or _text(record, "severity") or _text(record, "message")
            or (None if isinstance(record.get("evidence", {}), (dict, type(None))) else
                f"has \"evidence\" {record['evidence']!r}, not an object"))


def sample_problem(record: dict[str, Any]) -> str | None:
    if "time" not in record:
        return 'has no "time"'
    return _number(record, "time") or _whole(record, "step", required=False)


def typical_rate(rates: list[float]) -> float | None:
    """A run's typical rate (samples/s, tokens/s) from its train records: the median over its logs, so one
    slow or fast interval (an evaluation, a checkpoint, a busy machine) does not stand for the run. The first
    log, which includes start-up, counts only while it is the only one."""
    rates = rates[1:] if len(rates) > 1 else rates
    if not rates:
        return None
    ordered = sorted(rates)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def append(path: Path, line: bytes, *, advice: str = "") -> None:
    """Append one record. On an error the file is cut back, so no half record is left; a full disk raises
    DiskFullError (`advice` says what to do next)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(line)
        try:
            while view:  # a nearly full disk can take part of a write
                view = view[os.write(fd, view):]
        except OSError as error:
            os.ftruncate(fd, start)
            if is_disk_full(error):
                raise DiskFullError(path.parent, shutil.disk_usage(path.parent).free, len(line),
                                    f"a record of {path.name}", advice=advice) from error
            raise
    finally:
        os.close(fd)


def seal(path: Path) -> None:
    """Cut a record torn by a crash off the end of `path`, so the next append starts on a line of its own.

    Only the run's writer calls this (it holds the lock: nobody else is appending).
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "rb+") as f:
        end = size
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            chunk = f.read(end - start)
            if end == size and chunk.endswith(b"\n"):
                return
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                f.truncate(start + newline + 1)
                return
            end = start
        f.truncate(0)


def _whole(record: dict[str, Any], key: str, *, required: bool) -> str | None:
    if key not in record or (record[key] is None and not required):
        return f'has no "{key}"' if required else None
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int):
        return f'has "{key}" {value!r}, not a whole number'
    return None


def _number(record: dict[str, Any], key: str) -> str | None:
    if key not in record:
        return None
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f'has "{key}" {value!r}, not a finite number'
    return None


def _text(record: dict[str, Any], key: str) -> str | None:
    if key in record and not isinstance(record[key], str):
        return f'has "{key}" {record[key]!r}, not text'
    return None


def encode(record: dict[str, Any]) -> bytes:
    """One JSONL line; tensors and NumPy numbers become plain numbers, anything else its text."""
    return (json.dumps(record, default=_jsonable) + "\n").encode("utf-8")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
