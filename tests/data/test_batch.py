"""The batch contract's host-side reads: real (non-padding) tokens, document boundaries for the built-in gpt and
for FlashAttention's variable-length kernel — all from the tensors the loader made, before the copy."""
from __future__ import annotations

import numpy as np
import torch

from trainwise.data.batch import IGNORE_INDEX, document_lengths, flattened_for_varlen, real_tokens
from trainwise.data.text.packing import pack_sample


class Stream:
    """A token stream of documents of 5 and 4 tokens (a TokenSplit's reading surface)."""

    offsets = np.array([0, 5, 9])
    total = 9

    def tokens(self, start, end):
        return np.arange(10, 19)[start:end]

    def loss_mask(self, start, end):
        return np.ones(end - start, dtype=np.uint8)


def packed_rows() -> dict[str, torch.Tensor]:
    samples = [pack_sample(Stream(), 0, 9, 12, pad_id=0), pack_sample(Stream(), 5, 9, 12, pad_id=0)]
    return {key: torch.from_numpy(np.stack([s[key] for s in samples])) for key in samples[0]}


def test_real_tokens_leave_out_the_padding():
    batch = packed_rows()  # 9 real tokens + 3 padding, and 4 real + 8 padding
    assert real_tokens([batch]) == 13
    assert real_tokens([{"labels": torch.full((1, 8), IGNORE_INDEX)}]) == 0


def test_document_lengths_per_row_with_the_padding_its_own():
    assert document_lengths(packed_rows()["position_ids"]) == [[5, 4, 3], [4, 8]]


def test_flattened_for_varlen_drops_the_padding_and_gives_the_documents_bounds():
    batch = packed_rows()
    flat = flattened_for_varlen(batch)
    assert flat["input_ids"].shape == (1, 13)  # the real tokens only: no padding reaches the kernel
    assert flat["input_ids"][0].tolist() == batch["input_ids"][0, :9].tolist() + batch["input_ids"][1, :4].tolist()
    assert flat["cu_seq_lens_q"].tolist() == [0, 5, 9, 13]
    assert flat["max_length_q"] == 5 and flat["cu_seq_lens_q"].dtype == torch.int32
