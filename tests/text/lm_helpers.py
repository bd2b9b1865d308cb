"""Tiny language-model pieces for the text tests: a 2-layer GPT and token batches with uneven label counts."""
from __future__ import annotations

import torch

from trainwise.text.gpt import GPT, GPTConfig
from trainwise.data.batch import IGNORE_INDEX

VOCAB = 40


def tiny_gpt(seed: int = 0, context: int = 16) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, context=context, layers=2, heads=2, width=16))


def token_batches(rows: int = 8, length: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows with very different numbers of label tokens (row i keeps about i/rows of its labels)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (rows, length), generator=g)
    labels = torch.randint(0, VOCAB, (rows, length), generator=g)
    for row in range(rows):
        labels[row, 1 + (row * length) // rows:] = IGNORE_INDEX
    position_ids = torch.arange(length).repeat(rows, 1)
    position_ids[::2, length // 2:] -= length // 2  # every other row packs two documents
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


def split_rows(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    rows = len(batch["input_ids"])
    return [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, rows, size)]
