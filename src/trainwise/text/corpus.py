"""Raw text in: `.txt`/`.md` files (one document each), folders of them, or JSONL with a text field (one
document a line). What cannot be read as a document (not UTF-8, empty, a broken JSON line, no text field)
is yielded as a `Document` with a `problem` and no text, so `prepare` names it and carries on.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainwise.errors import DataError

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl",)


@dataclass(frozen=True)
class Document:
    name: str  # the file, or file:line for JSONL
    text: str | None
    problem: str | None = None


def text_files(source: Path) -> list[Path]:
    """The files of a text source, in a stable order (hidden files left out)."""
    suffixes = TEXT_SUFFIXES + JSONL_SUFFIXES
    if source.is_file():
        if source.suffix.lower() not in suffixes:
            raise DataError(f"{source}: not a text source; give .txt/.md files (a document each), a folder of "
                            "them, or JSONL with a `text` field per line.")
        return [source]
    files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in suffixes
                   and not any(part.startswith(".") for part in p.relative_to(source).parts))
    if not files:
        raise DataError(f"{source}: holds no .txt, .md or .jsonl files.")
    return files


def looks_like_text(source: Path) -> bool:
    """A text file, or a folder whose files include text and no images (images come in class folders)."""
    if source.is_file():
        return source.suffix.lower() in TEXT_SUFFIXES + JSONL_SUFFIXES
    from trainwise.data.images import IMAGE_SUFFIXES

    suffixes = {p.suffix.lower() for p in source.rglob("*") if p.is_file()}
    return bool(suffixes & set(TEXT_SUFFIXES + JSONL_SUFFIXES)) and not suffixes & set(IMAGE_SUFFIXES)


def read_documents(source: Path, text_field: str = "text") -> Iterator[Document]:
    """Every document of the source, in order; unreadable ones with their problem."""
    for path in text_files(source):
        name = str(path.relative_to(source)) if source.is_dir() else path.name
        if path.suffix.lower() in JSONL_SUFFIXES:
            yield from _jsonl_documents(path, name, text_field)
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            yield Document(name, None, f"not UTF-8 (byte 0x{error.object[error.start]:02x} at offset {error.start})")
            continue
        yield _checked(name, text)


def _jsonl_documents(path: Path, name: str, text_field: str) -> Iterator[Document]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"{name}:{number}"
            if not raw.strip():
                continue  # blank lines between records are not documents
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                yield Document(where, None, "not UTF-8")
                continue
            except json.JSONDecodeError as error:
                yield Document(where, None, f"not JSON ({error.msg})")
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
