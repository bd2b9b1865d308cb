"""Tokenizers: byte-level, a BPE trained here, a model directory's; saved and read back by fingerprint."""
from __future__ import annotations

import json

import pytest

from trainwise.errors import DataError
from trainwise.data.text.tokenizer import (KIND_FILE, BpeTokenizer, ByteTokenizer, ModelTokenizer, load_tokenizer,
                                      resolve_tokenizer)

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "Ünïcödé text, and numbers 12345.",
         "def train(model):\n    return model\n"] * 5


def test_bytes_round_trip_and_reload(tmp_path):
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("héllo")
    assert ids == list("héllo".encode()) and max(ids) < 256 and tokenizer.eos_id == 256
    assert tokenizer.decode(ids + [tokenizer.eos_id]) == "héllo"
    loaded = load_tokenizer(tokenizer.save(tmp_path / "tok"))
    assert isinstance(loaded, ByteTokenizer) and loaded.fingerprint == tokenizer.fingerprint


def test_bpe_trained_locally_round_trips_and_reloads(tmp_path):
    tokenizer = BpeTokenizer.train(TEXTS, 300)
    assert 257 < tokenizer.vocab_size <= 300 and tokenizer.eos_id is not None
    for text in TEXTS[:3]:
        ids = tokenizer.encode(text)
        assert len(ids) < len(text.encode())  # merges were learned
        assert tokenizer.decode(ids) == text
    loaded = load_tokenizer(tokenizer.save(tmp_path / "tok"))
    assert loaded.fingerprint == tokenizer.fingerprint and loaded.encode(TEXTS[0]) == tokenizer.encode(TEXTS[0])
    assert BpeTokenizer.train(TEXTS, 300).fingerprint == tokenizer.fingerprint  # deterministic
    assert BpeTokenizer.train(TEXTS, 280).fingerprint != tokenizer.fingerprint


def test_model_directory_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    bpe = BpeTokenizer.train(TEXTS, 300)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe.backend, eos_token="<|endoftext|>")
    fast.save_pretrained(str(tmp_path / "model"))
    tokenizer = resolve_tokenizer(str(tmp_path / "model"), None)
    assert isinstance(tokenizer, ModelTokenizer) and tokenizer.eos_id == bpe.eos_id
    assert tokenizer.encode(TEXTS[1]) == bpe.encode(TEXTS[1]) and tokenizer.decode(bpe.encode(TEXTS[1])) == TEXTS[1]
    again = load_tokenizer(tokenizer.save(tmp_path / "saved"))
    assert again.fingerprint == tokenizer.fingerprint


def test_changed_tokenizer_files_are_refused(tmp_path):
    directory = BpeTokenizer.train(TEXTS, 300).save(tmp_path / "tok")
    other = BpeTokenizer.train(TEXTS, 280)
    (directory / "tokenizer.json").write_text(other.backend.to_str())
    with pytest.raises(DataError, match="changed since they were saved"):
        load_tokenizer(directory)
    (directory / KIND_FILE).write_text(json.dumps({"kind": "sentencepiece"}))
    with pytest.raises(DataError, match="unknown tokenizer kind"):
        load_tokenizer(directory)
