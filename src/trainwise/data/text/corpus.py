"""Raw text in: `.txt`/`.md` files (one document each), folders of them, or rows with a text field (one document
a row): JSONL, a JSON array, or Parquet (data/text/rows.py reads them). What cannot be read as a document (not
UTF-8, empty, a broken JSON line, no text field or one that is not a string) is yielded as a `Document` with a
`problem` and no text, so `prepare` names it and carries on. A file's UTF-8 byte-order mark is not text.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trainwise.errors import DataError
from trainwise.data.text.rows import JSONL_SUFFIXES, PARQUET_SUFFIXES, ROW_SUFFIXES, RowError, chat_keys, first_keys, \
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


def read_documents(source: Path, text_field: str = "text", repaired: list[str] | None = None
                   ) -> Iterator[Document]:
    """Every document of the source, in order; unreadable ones with their problem. `repaired`: rows kept with
    lone surrogates replaced (data/text/rows.py)."""
    for path in text_files(source):
        name = str(path.relative_to(source)) if source.is_dir() else path.name
        if path.suffix.lower() in ROW_SUFFIXES:
            yield from _row_documents(path, name, text_field, repaired)
            continue
        try:
            text = path.read_bytes().decode("utf-8-sig")
        except UnicodeDecodeError as error:
            yield Document(name, None, f"not UTF-8 (byte 0x{error.object[error.start]:02x} at offset {error.start})")
            continue
        yield _checked(name, text)


def _row_documents(path: Path, name: str, text_field: str, repaired: list[str] | None) -> Iterator[Document]:
    for where, record in read_rows(path, name, repaired):
        if isinstance(record, RowError):
            yield Document(where, None, str(record))
            continue
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            yield Document(where, None, _no_text(record, text_field))
            continue
        yield _checked(where, text)


def _no_text(record: object, text_field: str) -> str:
    """Why a row holds no document: not an object, no such field, or a field of another type than text."""
    if not isinstance(record, dict):
        return f"a row must be a JSON object with a `{text_field}` field, not {_json_type(record)}"
    if text_field in record:
        return (f"the `{text_field}` field is {_json_type(record[text_field])}, not a string; a document's text "
                "must be a string (fix this row, or pick another field with --text-field)")
    return f"no `{text_field}` field (has: {', '.join(sorted(record)[:6])}); pick the field with --text-field"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and value != value:
        return "NaN (a number)"
    names = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _checked(name: str, text: str) -> Document:
    if not text.strip():
        return Document(name, None, "empty")
    return Document(name, text)


@dataclass
class SplitCopies:
    """Held-out documents (or conversations) that are exact copies of training ones: their loss measures
    memory, not learning. Counted per split, the first few named."""

    train: set[bytes] = field(default_factory=set)
    held_out: list[tuple[str, str, bytes]] = field(default_factory=list)  # (split, name, digest)

    def add(self, split: str, name: str, text: str) -> None:
        digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=16).digest()
        if split == "train":
            self.train.add(digest)
        else:
            self.held_out.append((split, name, digest))

    def notes(self) -> list[str]:
        copies = [(split, name) for split, name, digest in self.held_out if digest in self.train]
        if not copies:
            return []
        counts = {split: sum(s == split for s, _ in copies) for split in ("val", "test")}
        said = " and ".join(f"{count} in {split}" for split, count in counts.items() if count)
        named = ", ".join(name for _, name in copies[:3] if name)
        return [f"exact duplicates across splits: {said} are copies of training documents"
                f"{f' (first: {named})' if named else ''}; held-out loss on them measures memory, not learning. "
                "Remove the duplicates from the source and prepare again."]


def repair_notes(repaired: list[str]) -> list[str]:
    """One line for rows kept after a repair (lone surrogates replaced), naming the first few."""
    if not repaired:
        return []
    return [f"{len(repaired)} row{'s' if len(repaired) > 1 else ''} kept with lone surrogates replaced by U+FFFD "
            f"(half of a UTF-16 pair, which no tokenizer can encode): {'; '.join(repaired[:3])}"
            f"{' ...' if len(repaired) > 3 else ''}"]
