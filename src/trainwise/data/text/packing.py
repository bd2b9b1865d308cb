"""Packing documents into fixed-length training sequences without letting them see each other.

A pack is a contiguous range `[start, end)` of a split's token stream, at most `seq_len` long, padded to
`seq_len`. Each sample is a dict (the batch contract every language-model path relies on):

- `input_ids` [T] int64: the tokens, then padding;
- `labels` [T] int64, already aligned with the model's outputs: `labels[t]` is the id expected at output
  position t (the next token of the same document), -100 where no loss is due — the last token of a
  document, padding, and tokens whose loss mask is 0 (prompts of instruction data);
- `position_ids` [T] int64: restarting at 0 at every document (and at a pack's first token), so a model
  derives a block-diagonal causal mask from them and each document is computed exactly as if alone.

Two ways to cut: `split_documents=True` (pretraining) fills every pack to the brim, cutting a document at
a pack's end and continuing it in the next; `False` (instruction data) keeps a document whole in one pack
when it fits, starting a new pack otherwise, and cuts only documents longer than `seq_len`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from trainwise.data.batch import IGNORE_INDEX
from trainwise.data.text.token_shards import TokenSplit


def pack_ranges(offsets: np.ndarray, seq_len: int, *, split_documents: bool = True) -> np.ndarray:
    """[packs, 2] start and end of each pack in the token stream, given document offsets."""
    total = int(offsets[-1])
    if split_documents:
        starts = np.arange(0, total, seq_len, dtype=np.int64)
        return np.stack([starts, np.minimum(starts + seq_len, total)], axis=1)
    ranges: list[tuple[int, int]] = []
    pack_start = pack_end = 0
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        if end - start > seq_len:  # a long document: cut into whole packs of its own
            if pack_end > pack_start:
                ranges.append((pack_start, pack_end))
            ranges.extend((s, min(s + seq_len, end)) for s in range(start, end, seq_len))
            pack_start = pack_end = end
        elif end - pack_start > seq_len:
            if pack_end > pack_start:
                ranges.append((pack_start, pack_end))
            pack_start, pack_end = start, end
        else:
            pack_end = end
    if pack_end > pack_start:
        ranges.append((pack_start, pack_end))
    return np.asarray(ranges, dtype=np.int64).reshape(-1, 2)


def pack_sample(stream: TokenSplit, start: int, end: int, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """One pack as numpy arrays (see the module docstring)."""
    offsets = stream.offsets
    length = end - start
    positions = np.arange(start, end, dtype=np.int64)
    document = np.searchsorted(offsets, positions, side="right") - 1
    document_start, document_end = offsets[document], offsets[document + 1]
    following = stream.tokens(start, min(end + 1, stream.total)).astype(np.int64)
    next_ids = np.full(length, IGNORE_INDEX, dtype=np.int64)
    next_ids[:len(following) - 1] = following[1:]
    target = stream.loss_mask(start + 1, min(end + 1, stream.total))
    is_target = np.zeros(length, dtype=bool)
    is_target[:len(target)] = target.astype(bool)
    keep = (positions + 1 < document_end) & is_target
    input_ids = np.full(seq_len, pad_id, dtype=np.int64)
    labels = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    position_ids = np.arange(seq_len, dtype=np.int64) - length  # the padding: one segment of its own
    input_ids[:length] = following[:length]
    labels[:length] = np.where(keep, next_ids, IGNORE_INDEX)
    position_ids[:length] = positions - np.maximum(document_start, start)
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


class PackedTextDataset(Dataset):
    """Packs of one split of a prepared text dataset; `dataset.__getitems__(indices)` returns a batch dict."""

    batched = True  # __getitems__ returns the collated batch; the loader passes it through
    reads_in_place = True  # a batch is a few memory-map reads

    def __init__(self, stream: TokenSplit, seq_len: int, *, pad_id: int, split_documents: bool = True):
        if seq_len < 2:
            raise ValueError(f"seq_len {seq_len}: a sequence needs at least 2 tokens")
        self.stream, self.seq_len, self.pad_id = stream, seq_len, pad_id
        self.ranges = pack_ranges(stream.offsets, seq_len, split_documents=split_documents)

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start, end = self.ranges[index].tolist()
        return {k: torch.from_numpy(v) for k, v in pack_sample(self.stream, start, end, self.seq_len,
                                                               self.pad_id).items()}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        samples = [self.__getitem__(int(i)) for i in indices]
        return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}

    @property
    def packing_efficiency(self) -> float:
        """Share of the packed positions that hold real tokens (the rest is padding)."""
        used = int((self.ranges[:, 1] - self.ranges[:, 0]).sum())
        return used / max(1, len(self.ranges) * self.seq_len)


def length_report(lengths: np.ndarray, seq_len: int | None = None) -> dict[str, Any]:
    """Document lengths in tokens: a histogram, a suggested context length (the power of two that holds 90%
    of the documents whole, between 64 and 4,096), and, at that length, the share of documents cut and how
    full the packs are when documents are kept whole."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return {"documents": 0, "histogram": [], "suggested_seq_len": seq_len or 64,
                "truncated_share": 0.0, "packing_efficiency": 0.0}
    p90 = float(np.percentile(lengths, 90))
    suggested = int(min(4096, max(64, 2 ** int(np.ceil(np.log2(max(p90, 1)))))))
    length = seq_len or suggested
    edges = [0] + [2 ** k for k in range(4, 17)] + [int(lengths.max()) + 1]
    edges = sorted(set(e for e in edges if e <= int(lengths.max()) + 1))
    counts, _ = np.histogram(lengths, bins=edges)
    used = np.nonzero(counts)[0]
    edges, counts = edges[used[0]:used[-1] + 2], counts[used[0]:used[-1] + 1]  # no empty rows at either end
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    whole = pack_ranges(offsets, length, split_documents=False)
    efficiency = float(lengths.sum()) / max(1, len(whole) * length)
    return {"documents": int(len(lengths)), "tokens": int(lengths.sum()),
            "median": float(np.median(lengths)), "p90": p90, "max": int(lengths.max()),
            "histogram": [[int(lo), int(hi), int(c)] for lo, hi, c in zip(edges[:-1], edges[1:], counts)],
            "suggested_seq_len": suggested, "seq_len": length,
            "truncated_share": float((lengths > length).mean()), "packing_efficiency": efficiency}
