"""Raw text in: `.txt`/`.md` files (one document each), folders of them, or rows with a text field (one document
a row): JSONL, a JSON array, or Parquet (text/rows.py reads them). What cannot be read as a document (not
UTF-8, empty, a broken JSON line, no text field) is yielded as a `Document` with a `problem` and no text, so
`prepare` names it and carries on.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainwise.errors import DataError
from trainwise.text.rows import JSONL_SUFFIXES, PARQUET_SUFFIXES, ROW_SUFFIXES, RowError, chat_keys, first_keys, \
    read_rows

TEXT_SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class Document:
    name: str  # the file, or the row: file:line for JSONL, file[index] for a JSON array or Parquet
    text: str | None
    problem: str | None = None


def text_files(source: Path) -> list[Path]:
    """The files of a text source, in a stable order (hidden files left out)."""
    suffixes = TEXT_SUFFIXES + ROW_SUFFIXES
    if source.is_file():
        if source.suffix.lower() not in suffixes:
            raise DataError(f"{source}: not a text source; give .txt/.md files (a document each), a folder of "
                            "them, or JSONL, JSON or Parquet rows with a `text` field.")
        return [source]
    files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in suffixes
                   and not any(part.startswith(".") for part in p.relative_to(source).parts))
    if not files:
        raise DataError(f"{source}: holds no .txt, .md, .jsonl, .json or .parquet files.")
    return files


def looks_like_text(source: Path, text_field: str = "text") -> bool:
    """Text or instruction data: a text or JSON(L) file, a Parquet file whose columns are chat rows or a text
    field (not a table with a label column), or a folder of these with no images (images come in class folders)."""
    from trainwise.data.images import IMAGE_SUFFIXES

    if source.is_file():
        return source.suffix.lower() in TEXT_SUFFIXES + ROW_SUFFIXES and \
            (source.suffix.lower() not in PARQUET_SUFFIXES or _text_parquet(source, text_field))
    suffixes = {p.suffix.lower() for p in source.rglob("*") if p.is_file()}
    if suffixes & set(IMAGE_SUFFIXES):
        return False
    if suffixes & set(TEXT_SUFFIXES + JSONL_SUFFIXES + (".json",)):
        return True
    parquet = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in PARQUET_SUFFIXES)
    return bool(parquet) and _text_parquet(parquet[0], text_field)


def _text_parquet(path: Path, text_field: str) -> bool:
    from trainwise.data.tables import LABEL_NAMES

    columns = first_keys(path)
    return chat_keys(columns) or (text_field in columns and not {c.lower() for c in columns} & set(LABEL_NAMES))


def read_documents(source: Path, text_field: str = "text") -> Iterator[Document]:
    """Every document of the source, in order; unreadable ones with their problem."""
    for path in text_files(source):
        name = str(path.relative_to(source)) if source.is_dir() else path.name
        if path.suffix.lower() in ROW_SUFFIXES:
            yield from _row_documents(path, name, text_field)
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            yield Document(name, None, f"not UTF-8 (byte 0x{error.object[error.start]:02x} at offset {error.start})")
            continue
        yield _checked(name, text)


def _row_documents(path: Path, name: str, text_field: str) -> Iterator[Document]:
    for where, record in read_rows(path, name):
        if isinstance(record, RowError):
            yield Document(where, None, str(record))
            continue
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            found = ", ".join(sorted(record)[:6]) if isinstance(record, dict) else type(record).__name__
            yield Document(where, None, f"no string `{text_field}` field (has: {found}); pick the field "
                                        "with --text-field")
            continue
        yield _checked(where, text)


def _checked(name: str, text: str) -> Document:
    if not text.strip():
        return Document(name, None, "empty")
    return Document(name, text)
