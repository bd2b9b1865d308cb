"""Rows of a data file, whatever form it comes in: JSONL (a JSON object a line), `.json` (an array of objects,
an object holding one such array under a single key such as `data` or `train`, or JSONL under a .json name), and
Parquet (read in row batches; nested columns come out as lists of dicts). Instruction data (chat.py) and text
corpora (corpus.py) read through here.

Each row comes with its source: `file:line` for JSONL, `file[index]` (0-based) for arrays and Parquet. A row
that cannot be read is yielded as a `RowError` in its place, so callers name it and carry on (nesting deeper
than Python's JSON reader goes, a number of more than 4,300 digits); a file that cannot be read at all (a
broken JSON array, a file that is not Parquet) is one RowError named by the file. A UTF-8 byte-order mark at
the start of a file is not data. A lone surrogate (`"\ud800"`, common in scraped JSON: half of a UTF-16 pair,
which no tokenizer can encode) is replaced by U+FFFD and the row is kept: `read_rows` reports each such row
to its `repaired` list, so prepare says which rows were changed.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from trainwise.data.table_files import PARQUET_SUFFIXES, parquet_module
from trainwise.errors import DataError

JSONL_SUFFIXES = (".jsonl",)
JSON_SUFFIXES = (".json",)
ROW_SUFFIXES = JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
PARQUET_BATCH = 1024  # rows decoded at once: a large Parquet file is never held whole
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # how JSON writes half of a UTF-16 pair
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # what is left of one after decoding, when unpaired
ROW_KEYS = ("messages", "conversations", "instruction", "output", "prompt", "completion", "text")


class RowError(ValueError):
    """One row (or a whole file) cannot be used: the message says what is wrong with it."""


Rows = Iterator[tuple[str, "object | RowError"]]


def is_row_file(path: Path) -> bool:
    return path.suffix.lower() in ROW_SUFFIXES


def read_rows(path: Path, name: str | None = None, repaired: list[str] | None = None) -> Rows:
    """(source, row or RowError) for every row of `path`, in order; `name` is how sources name the file.
    `repaired` collects "source (count)" for rows kept with lone surrogates replaced."""
    name = str(path) if name is None else name
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        yield from _parquet_rows(path, name)
        return
    rows = _json_rows(path, name) if suffix in JSON_SUFFIXES else _jsonl_rows(path, name)
    for source, row in rows:
        if isinstance(row, tuple):  # (row, lone surrogates replaced in it)
            row, replaced = row
            if repaired is not None:
                repaired.append(f"{source} ({replaced})")
        yield source, row


def _jsonl_rows(path: Path, name: str) -> Iterator[tuple[str, object]]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is not part of the first row
            if not raw.strip():
                continue  # blank lines between records are not rows
            yield f"{name}:{number}", _repaired(_parse(raw), SURROGATE_ESCAPE.search(raw) is not None)


def _repaired(row: object, escaped: bool) -> object:
    """The row, or (row, count) with its lone surrogates replaced when it has any (`escaped`: the raw text
    writes a surrogate; without one, nothing to look for)."""
    if not escaped or isinstance(row, RowError):
        return row
    fixed, replaced = _without_lone_surrogates(row)
    return (fixed, replaced) if replaced else row


def _parse(raw: bytes) -> object:
    """A parsed row, or a RowError saying why it cannot be read."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return RowError(f"not UTF-8 ({e.reason} at byte {e.start})")
    except json.JSONDecodeError as e:
        where = f" at line {e.lineno}," if e.lineno > 1 else ","  # a .json file's lines; a JSONL row is one line
        return RowError(f"not valid JSON ({e.msg}{where} column {e.colno})")
    except RecursionError:
        return RowError("nested deeper than a JSON reader can follow (thousands of brackets): not a row")
    except ValueError as e:  # Python refuses integers of more than 4,300 digits (a denial-of-service guard)
        return RowError(f"holds a number too long to read ({str(e).split(';')[0]})")
    return row


def _without_lone_surrogates(value: object) -> tuple[object, int]:
    """`value` with every unpaired surrogate in its strings (keys too) replaced by U+FFFD, and how many."""
    if isinstance(value, str):
        return LONE_SURROGATE.subn("\ufffd", value)
    if isinstance(value, list):
        pairs = [_without_lone_surrogates(item) for item in value]
        return [item for item, _ in pairs], sum(n for _, n in pairs)
    if isinstance(value, dict):
        out, total = {}, 0
        for key, item in value.items():
            (key, k), (item, n) = _without_lone_surrogates(key), _without_lone_surrogates(item)
            out[key], total = item, total + k + n
        return out, total
    return value, 0


def _json_rows(path: Path, name: str) -> Iterator[tuple[str, object]]:
    """A .json file: an array of rows, {"key": [rows]}, one row object, or JSONL under a .json name."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        yield name, RowError(f"not UTF-8 ({e.reason} at byte {e.start})")
        return
    document = _parse(data.removeprefix(b"\xef\xbb\xbf"))
    if isinstance(document, RowError):
        if "not valid JSON" in str(document) and text.lstrip().startswith("{"):
            yield from _jsonl_rows(path, name)  # JSONL named .json: each line is a row, broken lines named alone
        else:
            yield name, RowError(f"{document}; a .json file holds an array of rows, or write one JSON object a "
                                 "line (JSONL)")
        return
    rows = _unwrap(document)
    if rows is None:
        yield name, RowError(f"a .json file must hold an array of row objects (or one object with a single list "
                             f"of them, like {{\"data\": [...]}}); this one holds {_describe(document)}")
        return
    escaped = SURROGATE_ESCAPE.search(data) is not None
    for index, row in enumerate(rows):
        yield f"{name}[{index}]", _repaired(row, escaped)


def _unwrap(document: object) -> list | None:
    """The rows of a parsed .json document, or None when it holds none."""
    if isinstance(document, list):
        return document
    if not isinstance(document, dict):
        return None
    if set(document) & set(ROW_KEYS):
        return [document]  # the file is one row (JSONL of a single line)
    lists = [value for value in document.values()
             if isinstance(value, list) and value and all(isinstance(item, dict) for item in value)]
    return lists[0] if len(lists) == 1 else None


def _describe(document: object) -> str:
    if isinstance(document, dict):
        return f"an object with keys {sorted(document)[:6]}"
    return f"a {type(document).__name__}"


def _parquet_rows(path: Path, name: str) -> Rows:
    pq = parquet_module(path)
    try:
        file = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises its own ArrowInvalid / OSError for a file that is not Parquet
        yield name, RowError(f"not a readable Parquet file ({e})")
        return
    index = 0
    try:
        for batch in file.iter_batches(batch_size=PARQUET_BATCH):
            for row in batch.to_pylist():
                yield f"{name}[{index}]", row
                index += 1
    except Exception as e:  # a corrupt row group: what came before it is kept
        yield f"{name}[{index}]", RowError(f"the Parquet file cannot be read from here on ({e})")


def first_keys(path: Path) -> set[str]:
    """The fields of a file's rows, from its first row (a Parquet file's columns): empty when none is readable."""
    if path.suffix.lower() in PARQUET_SUFFIXES:
        try:
            return set(parquet_module(path).read_schema(path).names)
        except DataError:
            raise
        except Exception:
            return set()
    for _, row in read_rows(path):
        if isinstance(row, dict):
            return set(row)
        if not isinstance(row, RowError):
            return set()
    return set()


def chat_keys(keys: set[str]) -> bool:
    """Whether rows with these fields are instruction data (alpaca, sharegpt, messages or prompt-completion)."""
    return bool({"messages", "conversations", "instruction"} & keys) or {"prompt", "completion"} <= keys
