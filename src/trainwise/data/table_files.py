"""Reading a table file (CSV, TSV, Parquet) into columns, as people actually save them: in latin-1 from an old
spreadsheet, tab-separated under a .csv name, with a trailing comma that makes a nameless column, or with a
column name written twice. Each is either read the way the user meant, with a note saying how, or refused
with a message naming the byte, the line or the column and the fix.
"""
from __future__ import annotations

import codecs
import csv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainwise.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".pq")
SNIFF_BYTES = 64 * 1024  # the header line is looked for in this much of the file


@dataclass
class TableFile:
    """A table's columns (numbers as float64 with NaN for blanks, anything else as object strings/None), and
    notes on how it was read when that was not the obvious way (a guessed delimiter, a renamed column)."""

    columns: dict[str, np.ndarray]
    notes: list[str] = field(default_factory=list)


def read_table(path: Path, encoding: str | None = None) -> TableFile:
    """Read `path`; `encoding` (e.g. latin-1) for text files that are not UTF-8."""
    if encoding is not None:
        _check_encoding(encoding)
    parquet = path.suffix.lower() in PARQUET_SUFFIXES
    delimiter, notes = (",", []) if parquet else sniff_delimiter(path, encoding)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        if parquet:
            parquet_module(path)  # names the extra to install
        names, columns = _read_csv_module(path, delimiter, encoding)
    else:
        names, columns = _read_pyarrow(path, delimiter, encoding, parquet)
    named, renamed = _name_columns(path, names, columns)
    return TableFile(named, notes + renamed)


def parquet_module(path: Path):
    """pyarrow.parquet, or a DataError naming the extra that installs it (tables, text and chat rows read Parquet)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install 'trainwise[parquet]'") from None
    return pq


def read_columns(path: Path, encoding: str | None = None) -> dict[str, np.ndarray]:
    """Column name → values (see TableFile)."""
    return read_table(path, encoding).columns


def _check_encoding(encoding: str) -> None:
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise DataError(f"--encoding {encoding!r}: not an encoding Python knows; e.g. latin-1, cp1252, "
                        "utf-16.") from None


def sniff_delimiter(path: Path, encoding: str | None = None) -> tuple[str, list[str]]:
    """The delimiter of a text table: a tab for .tsv; for anything else a comma, unless the header line has
    no comma but tabs (or semicolons, as spreadsheets in many locales save "CSV"): then that, with a note."""
    if path.suffix.lower() == ".tsv":
        return "\t", []
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as e:
        raise DataError(f"{path}: cannot read the table ({e.strerror or e}).") from None
    header = head.decode(encoding or "utf-8", errors="replace").lstrip("\ufeff").splitlines()[:1]
    line = header[0] if header else ""

    def fields(delimiter: str) -> int:  # quotes respected: "a,b" is one name
        return len(next(csv.reader([line], delimiter=delimiter), []))

    if fields(",") < 2:
        for delimiter, name in (("\t", "tab"), (";", "semicolon")):
            if fields(delimiter) >= 2:
                return delimiter, [f"{path.name}: read as {name}-separated (its header line has {name}s and no "
                                   "commas between its names)."]
    return ",", []


def _read_pyarrow(path: Path, delimiter: str, encoding: str | None,
                  parquet: bool) -> tuple[list[str], list[np.ndarray]]:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if parquet:
            table = pq.read_table(path)
        else:
            table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(encoding=encoding or "utf8"),
                                   parse_options=pacsv.ParseOptions(delimiter=delimiter))
        names = [table.schema.field(i).name for i in range(table.num_columns)]
        return names, [_to_numpy(table.column(i)) for i in range(table.num_columns)]
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except (pa.ArrowInvalid, OSError) as e:
        if encoding is None and not parquet and "utf8" in str(e).lower().replace("-", ""):
            raise not_utf8(path) from None
        raise DataError(f"{path}: cannot read the table ({e}).") from None


def _to_numpy(column) -> np.ndarray:
    import pyarrow as pa

    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type):
        return column.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls → NaN
    values = column.cast(pa.string()).to_pylist()
    return np.array([None if v in (None, "") else v for v in values], dtype=object)


def _read_csv_module(path: Path, delimiter: str, encoding: str | None) -> tuple[list[str], list[np.ndarray]]:
    try:
        with open(path, newline="", encoding=encoding or "utf-8-sig") as f:
            reader = csv.reader(f, delimiter=delimiter)
            header = next(reader, None)
            rows = list(reader)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    if not header:
        raise DataError(f"{path}: empty file; a table needs a header row.")
    columns = []
    for i in range(len(header)):
        values = [row[i].strip() if i < len(row) and row[i].strip() else None for row in rows]
        try:
            columns.append(np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64))
        except ValueError:
            columns.append(np.array(values, dtype=object))
    return header, columns


def not_utf8(path: Path) -> DataError:
    where = first_non_utf8(path)
    at = f" (line {where[0]}: byte {where[1]:#04x})" if where else ""
    return DataError(f"{path} is not UTF-8{at}. Re-save it as UTF-8 (in a spreadsheet: Save as, CSV UTF-8), or "
                     "name its encoding: --encoding latin-1 (or cp1252, as Excel on Windows writes).")


def first_non_utf8(path: Path) -> tuple[int, int] | None:
    """(1-based line, byte) of the first byte that is not UTF-8, reading in chunks; None when all of it is.
    (Bytes the decoder holds back between chunks start a multi-byte character: never a newline.)"""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                return line + e.object[:e.start].count(b"\n"), e.object[e.start]
            if not chunk:
                return None
            line += chunk.count(b"\n")


def _name_columns(path: Path, names: list[str], columns: list[np.ndarray]
                  ) -> tuple[dict[str, np.ndarray], list[str]]:
    """Columns by name. A nameless column (a trailing comma) is dropped when it is empty, else called
    column_N; a name given twice is refused, naming it."""
    notes, kept = [], []
    for index, (name, values) in enumerate(zip(names, columns), start=1):
        if str(name).strip():
            kept.append((str(name), values))
        elif _all_blank(values):
            notes.append(f"{path.name}: column {index} has no name and no values; left out.")
        else:
            kept.append((f"column_{index}", values))
            notes.append(f"{path.name}: column {index} has no name; called column_{index}.")
    twice = [name for name, count in Counter(name for name, _ in kept).items() if count > 1]
    if twice:
        positions = {name: [i for i, n in enumerate(names, start=1) if n == name] for name in twice}
        listed = "; ".join(f"{name!r} (columns {', '.join(map(str, at))})" for name, at in positions.items())
        raise DataError(f"{path}: the header names a column twice: {listed}. Rename one of each so every "
                        "column has its own name.")
    return dict(kept), notes


def _all_blank(values: np.ndarray) -> bool:
    if values.dtype == object:
        return all(v is None for v in values)
    return bool(np.isnan(values).all())
