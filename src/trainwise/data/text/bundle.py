"""A prepared text dataset as the DataBundle a run trains on, and the corpus that ships with Python.

Each split is a `PackedTextDataset` of `seq_len`-token packs (data/text/packing.py); the DataSpec says how many
ids the tokenizer has (`num_classes`: the output size of a language model) and the sequence length
(`input_shape`). `pydoc_topics` is the standard library's own help text (pydoc_data.topics, ~465k
characters in ~80 topics), prepared once into a cache directory: a language-model demo with no download.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from trainwise.config.derived import text_sequence_length
from trainwise.data.bundle import DataBundle, DataSpec
from trainwise.data.shards import read_manifest
from trainwise.errors import ConfigError, DataError
from trainwise.data.text.packing import PackedTextDataset
from trainwise.data.text.token_shards import TOKENIZER_DIR, TokenSplit

MAX_CONTEXT = 1 << 17


def text_spec(manifest: dict[str, Any], seq_len: int, num_train: int = 0) -> DataSpec:
    tokenizer = manifest["tokenizer"]
    return DataSpec(input_shape=(seq_len,), num_classes=int(tokenizer["vocab_size"]), task="causal_lm",
                    input_dtype=torch.int64, num_train=num_train, tokenizer_fingerprint=tokenizer.get("fingerprint"),
                    instruct=bool(manifest.get("instruct")))


def text_bundle(path: str | Path, manifest: dict[str, Any] | None = None, *, seq_len: int | None = None,
                split_documents: bool = True) -> DataBundle:
    """The packed train/val/test splits of a prepared text dataset."""
    path = Path(path)
    manifest = manifest or read_manifest(path)
    instruct = manifest.get("instruct")
    if instruct:  # instruction samples stay whole in a pack: a prompt is never cut from its answer
        split_documents = False
    seq_len = text_sequence_length(seq_len, manifest)  # unset: what prepare suggested (config.derived)
    if not 2 <= seq_len <= MAX_CONTEXT:
        raise ConfigError(f"data.seq_len {seq_len}: a training sequence holds 2 to {MAX_CONTEXT:,} tokens.")
    tokenizer = manifest["tokenizer"]
    pad_id = tokenizer.get("pad_id")
    pad_id = int(pad_id if pad_id is not None else tokenizer.get("eos_id") or 0)
    splits = {}
    for split in ("train", "val", "test"):
        entry = manifest["splits"].get(split)
        splits[split] = (PackedTextDataset(TokenSplit(path, split, manifest), seq_len, pad_id=pad_id,
                                           split_documents=split_documents)
                         if entry and entry.get("count") else None)
    if splits["train"] is None:
        raise DataError(f"{path}: the train split holds no tokens; prepare with smaller val/test fractions.")
    notes = {"prepared": str(path), "tokenizer": str(path / TOKENIZER_DIR), "seq_len": seq_len,
             "packing_efficiency": splits["train"].packing_efficiency}
    return DataBundle(splits["train"], splits["val"], splits["test"],
                      spec=text_spec(manifest, seq_len, len(splits["train"])), notes=notes)


def cache_dir() -> Path:
    """Where trainwise keeps what it derives once per machine (TRAINWISE_CACHE, else ~/.cache/trainwise)."""
    return Path(os.environ.get("TRAINWISE_CACHE") or Path.home() / ".cache" / "trainwise")


def pydoc_topics(*, seed: int, val_fraction: float, test_fraction: float, augment: bool = False,
                 seq_len: int | None = None, train_tokenizer: int | None = None,
                 path: str | None = None) -> DataBundle:
    """Python's help topics as a text corpus: byte-level (or a BPE of `train_tokenizer` ids), one document
    per topic, split by topic. `path` (data.path): a prepared text dataset of your own instead."""
    from pydoc_data.topics import topics

    from trainwise.data.prepare import PrepareOptions
    from trainwise.data.prepare import prepare_corpus

    if augment:
        raise ConfigError("data.augment: text has no augmentation; set data.augment=false.")
    if path is not None:
        return text_bundle(path, seq_len=seq_len)
    source = cache_dir() / "pydoc_topics" / "source"
    _write_if_changed(source, topics)
    options = PrepareOptions(kind="text", val_fraction=val_fraction, test_fraction=test_fraction, seed=seed,
                             train_tokenizer=train_tokenizer, seq_len=seq_len)
    key = hashlib.sha256(repr((val_fraction, test_fraction, seed, train_tokenizer)).encode()).hexdigest()[:12]
    prepared = prepare_corpus(source, cache_dir() / "pydoc_topics" / f"prepared-{key}", options,
                              wait_s=600)  # runs (or test workers) started together share the cache: wait
    return text_bundle(prepared.directory, prepared.manifest, seq_len=seq_len)


def _write_if_changed(folder: Path, topics: dict[str, str]) -> None:
    """One file per topic, rewritten only when its text differs (prepare's cache keys on modification times)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(topics.items()):
        path = folder / f"{name}.txt"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            from trainwise.rundir.atomic import atomic_write_text

            atomic_write_text(path, text)
