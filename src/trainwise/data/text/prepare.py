"""`trainwise prepare CORPUS --to DIR` for raw text: documents → tokens → checksummed token shards.

Split by document (a document never straddles train and val), so validation measures text the model never
saw; a source of one document is split by position instead (its first 80% trains), and says so. The
tokenizer is the byte-level one by default, a BPE trained here on the training documents
(`--train-tokenizer 8000`), or a model directory's (`--tokenizer DIR`); it is saved beside the shards and
its fingerprint is in the manifest. Documents that cannot be read are named in the manifest and skipped.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainwise.config.derived import text_sequence_length
from trainwise.data.prepare_options import held_out_file, test_file_note
from trainwise.data.shards import SPLITS
from trainwise.errors import DataError
from trainwise.data.text.corpus import Document, SplitCopies, read_documents, repair_notes
from trainwise.data.text.tokenizer import Tokenizer, resolve_tokenizer
from trainwise.data.text.token_shards import TOKENIZER_DIR, TokenSplitWriter, text_schema, token_dtype

if TYPE_CHECKING:
    from trainwise.data.prepare_options import PrepareOptions

ENCODE_BATCH = 256  # documents encoded in one call (the `tokenizers` library parallelises a batch)
SKIPPED_LISTED = 1000  # skipped documents named in the manifest; the rest are counted
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")
TOKENIZER_FILE_BYTES = 256 * 2**20  # larger files of a model directory are weights, not tokenizer files


def tokenizer_files_fingerprint(spec: str | None) -> dict[str, str]:
    """{"tokenizer_files": sha256 of a --tokenizer directory's files}: the prepared ids depend on what the
    directory holds, not on its path, so a changed tokenizer is prepared again, never "up to date"."""
    directory = Path(spec).expanduser() if spec not in (None, "bytes") else None
    if directory is None or not directory.is_dir():
        return {}
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.is_file() and p.suffix not in WEIGHT_SUFFIXES
                       and p.stat().st_size <= TOKENIZER_FILE_BYTES):  # a model's weights are not its tokenizer
        digest.update(f"{path.name}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return {"tokenizer_files": digest.hexdigest()}


def prepare_text_or_chat(to: Path, source: Path, options: "PrepareOptions") -> dict[str, Any]:
    """Instruction data (alpaca / sharegpt / messages JSONL, detected or named with --format: text/
    instruct_prepare.py) or raw text."""
    from trainwise.data.text.chat_prepare import format_sample, prepare_chat

    held_out_file(source, options)  # refused before anything is read when it would train too
    sample = format_sample(source, options.text_field)  # chat or text, from the first rows (not the first alone)
    notes = [sample.note] if sample.note else []
    if options.chat_format != "auto" or sample.is_chat:
        return prepare_chat(to, source, options, notes)
    return prepare_text(to, source, options, notes)


def prepare_text(to: Path, source: Path, options: "PrepareOptions", notes: list[str] | None = None
                 ) -> dict[str, Any]:
    """Write the token shards and tokenizer of `source` into `to`; the manifest's text-specific fields.
    `notes`: what the caller found about the source, kept with the manifest's notes."""
    from trainwise.data.prepare_job import check_free_space
    from trainwise.data.splits import split_codes
    from trainwise.data.text.packing import length_report  # imports torch: only when text is prepared

    repaired: list[str] = []
    names, chars, skipped = _survey(source, options.text_field, repaired)
    _refuse_no_documents(source, names, skipped)
    held, held_names = held_out_file(source, options), []
    if held is not None:  # the test split: surveyed (and refused when unusable) as the source is
        held_names, held_chars, held_skipped = _survey(held, options.text_field, repaired)
        _refuse_no_documents(held, held_names, held_skipped, "--test-file ")
        chars, skipped = chars + held_chars, skipped + held_skipped
    by_position = len(names) == 1
    codes = np.zeros(1, np.int8) if by_position else split_codes(None, len(names), options)
    tokenizer = resolve_tokenizer(options.tokenizer, options.train_tokenizer,
                                  _texts(_pieces(source, options, codes, by_position), "train"))
    dtype = token_dtype(tokenizer.max_id + 1)
    check_free_space(to, chars * dtype.itemsize)  # at most one token per byte of text (byte-level)
    tokenizer.save(to / TOKENIZER_DIR)
    writers = {split: TokenSplitWriter(to, split, dtype, eos_id=tokenizer.separator_id) for split in SPLITS}
    copies = SplitCopies()
    _encode_into(writers, _pieces(source, options, codes, by_position), tokenizer, copies)
    splits, files = {}, {}
    for split, writer in writers.items():
        splits[split], side = writer.close()
        splits[split]["unit"] = "parts of one document" if by_position else "documents"
        files.update(side)
    _refuse_empty_training(splits["train"], len(names), by_position)
    lengths = np.diff(np.asarray(writers["train"].offsets))
    notes = list(notes or []) + repair_notes(repaired) + copies.notes() + (
        ["one document: split by position (the first part trains, the last parts validate and test)"]
        if by_position else []) + ([test_file_note(options, len(held_names), "documents")] if held else [])
    return {"task": "causal_lm", "schema": text_schema(dtype, False), "splits": splits, "files": files,
            "tokenizer": tokenizer.describe(), "lengths": length_report(lengths, options.seq_len), "notes": notes,
            "skipped": {"count": len(skipped), "files": skipped[:SKIPPED_LISTED]}}


def _refuse_no_documents(source: Path, names: list[str], skipped: list[dict[str, str]], option: str = "") -> None:
    if names:
        return
    listed = "; ".join(f"{s['file']}: {s['reason']}" for s in skipped[:5])
    raise DataError(f"{option}{source}: no usable document ({len(skipped)} skipped{': ' + listed if listed else ''}).")


def _refuse_empty_training(train: dict[str, Any], documents: int, by_position: bool) -> None:
    """A training split without a token trains nothing: said here, not as a puzzle at `trainwise train`."""
    if train["count"]:
        return
    where = ("the one document's first part is blank (it is split by position)" if by_position else
             f"none of the {documents} usable documents went to training")
    raise DataError(f"the training split holds no tokens: {where}. Give more text, or lower --val-fraction and "
                    "--test-fraction.")


def _survey(source: Path, text_field: str, repaired: list[str]) -> tuple[list[str], int, list[dict[str, str]]]:
    """The usable documents' names, their total size in bytes, and the skipped ones with the reason;
    `repaired` collects the rows kept with lone surrogates replaced."""
    names, size, skipped = [], 0, []
    for document in read_documents(source, text_field, repaired):
        if document.text is None:
            skipped.append({"file": document.name, "reason": document.problem or "unreadable"})
        else:
            names.append(document.name)
            size += len(document.text.encode("utf-8", errors="replace"))
    return names, size, skipped


def _pieces(source: Path, options: "PrepareOptions", codes: np.ndarray, by_position: bool
            ) -> Iterator[tuple[str, Document]]:
    """(split, document) for every usable document, in source order; then the --test-file's, all test."""
    usable = (d for d in read_documents(source, options.text_field) if d.text is not None)
    if by_position:
        yield from _split_by_position(next(usable), options.val_fraction, options.test_fraction)
    else:
        for code, document in zip(codes.tolist(), usable):
            yield SPLITS[code], document
    held = held_out_file(source, options)
    if held is not None:  # --test-file: every usable document of it is test
        yield from (("test", d) for d in read_documents(held, options.text_field) if d.text is not None)


def _split_by_position(document: Document, val_fraction: float, test_fraction: float
                       ) -> Iterator[tuple[str, Document]]:
    """One document cut at line breaks near the split fractions."""
    text = document.text or ""
    cuts = [0]
    for share in (1 - val_fraction - test_fraction, 1 - test_fraction):
        at = int(len(text) * share)
        newline = text.find("\n", at)
        cuts.append(max(cuts[-1], newline + 1 if 0 <= newline < at + 1000 else at))
    cuts.append(len(text))
    for split, start, end in zip(SPLITS, cuts[:-1], cuts[1:]):
        if text[start:end].strip():
            yield split, Document(f"{document.name}[{split}]", text[start:end])


def _texts(pieces: Iterator[tuple[str, Document]], split: str) -> Iterator[str]:
    return (document.text or "" for where, document in pieces if where == split)


def _encode_into(writers: dict[str, TokenSplitWriter], pieces: Iterator[tuple[str, Document]],
                 tokenizer: Tokenizer, copies: SplitCopies) -> None:
    batch: list[tuple[str, Document]] = []
    for piece in pieces:
        copies.add(piece[0], piece[1].name, piece[1].text or "")
        batch.append(piece)
        if len(batch) == ENCODE_BATCH:
            _write_batch(writers, batch, tokenizer)
            batch = []
    _write_batch(writers, batch, tokenizer)


def _write_batch(writers: dict[str, TokenSplitWriter], batch: list[tuple[str, Document]],
                 tokenizer: Tokenizer) -> None:
    if not batch:
        return
    for (split, _), ids in zip(batch, tokenizer.encode_batch([d.text or "" for _, d in batch])):
        writers[split].add(ids)


def summary_lines(manifest: dict[str, Any]) -> list[str]:
    """What `prepare` prints for text: tokens per split, the tokenizer, the length histogram and what it
    suggests, and the skipped documents by name."""
    tokenizer, lengths = manifest["tokenizer"], manifest["lengths"]
    lines = [", ".join(f"{split} {info['count']:,} tokens in {info.get('documents', 0):,} documents"
                       for split, info in manifest["splits"].items()),
             f"tokenizer: {tokenizer['kind']}, {tokenizer['vocab_size']:,} ids (fingerprint "
             f"{tokenizer['fingerprint'][:12]})"]
    lines += manifest.get("notes", [])
    if lengths.get("documents"):
        widest = max(count for _, _, count in lengths["histogram"]) or 1
        lines.append(f"document length (training split, tokens): median {lengths['median']:,.0f}, 90% under "
                     f"{lengths['p90']:,.0f}, longest {lengths['max']:,}")
        for low, high, count in lengths["histogram"]:
            lines.append(f"  {low:>7,}-{high - 1:<7,} {'#' * max(1 if count else 0, round(30 * count / widest)):<30} "
                         f"{count:,}")
        lines.append(f"context length {lengths['seq_len']:,} (suggested {text_sequence_length(None, manifest):,}, "
                     f"what train uses unless set with "
                     f"data.seq_len): {lengths['truncated_share']:.1%} of documents longer (cut into pieces), "
                     f"packing efficiency {lengths['packing_efficiency']:.1%} with whole documents")
    skipped = manifest.get("skipped", {})
    for entry in skipped.get("files", [])[:10]:
        lines.append(f"skipped {entry['file']}: {entry['reason']}")
    if skipped.get("count", 0) > 10:
        lines.append(f"... and {skipped['count'] - 10} more skipped (all listed in manifest.json)")
    return lines
