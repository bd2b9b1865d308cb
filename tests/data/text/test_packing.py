"""Token shards and packing: documents kept apart, labels aligned, -100 at document ends."""
from __future__ import annotations

import numpy as np
import pytest

from trainwise.data.shards import verify, write_manifest
from trainwise.data.text.packing import IGNORE_INDEX, PackedTextDataset, length_report, pack_ranges
from trainwise.data.text.token_shards import TokenSplit, TokenSplitWriter, text_schema, token_dtype


def write_text_dataset(directory, documents, *, vocab_size=300, eos_id=299, masks=None, tokens_per_shard=1 << 20):
    dtype = token_dtype(vocab_size)
    writer = TokenSplitWriter(directory, "train", dtype, eos_id=eos_id, with_loss_mask=masks is not None,
                              tokens_per_shard=tokens_per_shard)
    for i, ids in enumerate(documents):
        writer.add(ids, None if masks is None else masks[i])
    entry, files = writer.close()
    write_manifest(directory, {"kind": "text", "task": "causal_lm", "schema": text_schema(dtype, masks is not None),
                               "splits": {"train": entry}, "files": files,
                               "tokenizer": {"kind": "test", "vocab_size": vocab_size, "eos_id": eos_id}})
    return TokenSplit(directory, "train")


def test_shards_round_trip_across_files_and_verify(tmp_path):
    documents = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]
    stream = write_text_dataset(tmp_path, documents, tokens_per_shard=4)
    assert len(stream.shards) == 4 and stream.total == 13  # each document ends with eos 299
    assert stream.offsets.tolist() == [0, 4, 7, 13]
    assert stream.tokens(2, 9).tolist() == [3, 299, 4, 5, 299, 6, 7]
    assert np.load(tmp_path / stream.shards[0]["files"]["tokens"]["file"]).dtype == np.uint16
    assert verify(tmp_path) == []
    shard = tmp_path / stream.shards[1]["files"]["tokens"]["file"]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    assert [p.problem for p in verify(tmp_path)] == ["sha256 differs from the manifest (altered)"]


def test_large_vocabulary_uses_uint32():
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_packs_keep_documents_apart(tmp_path):
    stream = write_text_dataset(tmp_path, [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]])
    packs = PackedTextDataset(stream, 8, pad_id=0, split_documents=True)
    assert len(packs) == 2
    first = packs[0]
    assert first["input_ids"].tolist() == [1, 2, 3, 299, 4, 5, 299, 6]
    assert first["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    # labels: the next token of the same document; -100 at each document's last token (its eos)
    assert first["labels"].tolist() == [2, 3, 299, IGNORE_INDEX, 5, 299, IGNORE_INDEX, 7]
    second = packs[1]  # the cut document continues, positions restarting; then padding
    assert second["input_ids"].tolist() == [7, 8, 9, 10, 299, 0, 0, 0]
    assert second["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert second["labels"].tolist() == [8, 9, 10, 299] + [IGNORE_INDEX] * 4
    batch = packs.__getitems__([0, 1])
    assert batch["input_ids"].shape == (2, 8) and batch["labels"].dtype == batch["input_ids"].dtype


def test_whole_document_packing_and_long_documents(tmp_path):
    stream = write_text_dataset(tmp_path, [[1, 2], [3, 4], [5] * 10, [6]])
    packs = PackedTextDataset(stream, 7, pad_id=0, split_documents=False)
    assert pack_ranges(stream.offsets, 7, split_documents=False).tolist() == [[0, 6], [6, 13], [13, 17], [17, 19]]
    assert packs[0]["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert 0 < packs.packing_efficiency < 1


def test_loss_mask_limits_labels_to_targets(tmp_path):
    stream = write_text_dataset(tmp_path, [[1, 2, 3, 4]], masks=[[0, 0, 1, 1]])
    sample = PackedTextDataset(stream, 6, pad_id=0)[0]
    assert sample["labels"].tolist() == [IGNORE_INDEX, 3, 4, 299, IGNORE_INDEX, IGNORE_INDEX]


def test_length_report_suggests_a_context():
    report = length_report(np.array([10] * 50 + [100] * 45 + [1000] * 5))
    assert report["suggested_seq_len"] == 128 and report["truncated_share"] == pytest.approx(0.05)
    assert sum(count for _, _, count in report["histogram"]) == 100 and 0 < report["packing_efficiency"] <= 1
