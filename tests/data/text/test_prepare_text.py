"""`trainwise prepare` for raw text: split by document, bad documents named and skipped, lengths reported."""
from __future__ import annotations

import json

import pytest

from trainwise.data.prepare import PrepareOptions
from trainwise.data.prepare import prepare_corpus as prepare
from trainwise.data.shards import verify
from trainwise.errors import DataError
from trainwise.data.text.tokenizer import load_tokenizer
from trainwise.data.text.token_shards import TokenSplit


def make_corpus(root, documents=12):
    (root / "notes").mkdir(parents=True)
    for i in range(documents):
        folder = root / "notes" if i % 2 else root
        (folder / f"doc{i:02d}.{'md' if i % 3 else 'txt'}").write_text(f"Document {i}. " + "words and more " * (i + 3))
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "blank.md").write_text("\n  \n")
    with open(root / "rows.jsonl", "w") as f:
        f.write(json.dumps({"text": "a record of text"}) + "\n{oops\n" + json.dumps({"body": "no text"}) + "\n")
    return root


def test_text_folder_is_split_by_document_and_bad_files_named(tmp_path):
    source = make_corpus(tmp_path / "corpus")
    result = prepare(source, tmp_path / "out", PrepareOptions(val_fraction=0.2, test_fraction=0.2))
    manifest = result.manifest
    assert manifest["kind"] == "text" and manifest["tokenizer"]["kind"] == "bytes"
    splits = {name: TokenSplit(tmp_path / "out", name) for name in ("train", "val", "test")}
    assert sum(s.documents for s in splits.values()) == 13  # 12 files + one JSONL record
    assert all(s.documents >= 1 for s in splits.values())
    skipped = {entry["file"]: entry["reason"] for entry in manifest["skipped"]["files"]}
    assert skipped == {"latin1.txt": "not UTF-8 (byte 0xe9 at offset 3)", "blank.md": "empty",
                       "rows.jsonl:2": skipped["rows.jsonl:2"], "rows.jsonl:3": skipped["rows.jsonl:3"]}
    assert "not valid JSON" in skipped["rows.jsonl:2"] and "--text-field" in skipped["rows.jsonl:3"]
    tokenizer = load_tokenizer(tmp_path / "out" / "tokenizer")
    assert tokenizer.fingerprint == manifest["tokenizer"]["fingerprint"]
    train = splits["train"]
    first = train.tokens(int(train.offsets[0]), int(train.offsets[1])).tolist()
    assert first[-1] == tokenizer.eos_id and tokenizer.decode(first).startswith("Document ")
    lengths = manifest["lengths"]
    assert lengths["suggested_seq_len"] >= 64 and 0 < lengths["packing_efficiency"] <= 1
    assert verify(tmp_path / "out") == []
    again = prepare(source, tmp_path / "out", PrepareOptions(val_fraction=0.2, test_fraction=0.2))
    assert again.status == "up-to-date"


def test_one_document_is_split_by_position_and_bpe_trained(tmp_path):
    corpus = tmp_path / "book.txt"
    corpus.write_text("".join(f"line {i} of the only document in this corpus\n" for i in range(400)))
    manifest = prepare(corpus, tmp_path / "out", PrepareOptions(train_tokenizer=300)).manifest
    assert manifest["tokenizer"]["kind"] == "bpe" and manifest["tokenizer"]["vocab_size"] <= 300
    assert [manifest["splits"][s]["documents"] for s in ("train", "val", "test")] == [1, 1, 1]
    assert manifest["notes"] and manifest["splits"]["train"]["count"] > 4 * manifest["splits"]["val"]["count"]


def test_nothing_usable_is_a_clear_error(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("   ")
    with pytest.raises(DataError, match="no usable document.*a.txt: empty"):
        prepare(tmp_path / "src", tmp_path / "out")
