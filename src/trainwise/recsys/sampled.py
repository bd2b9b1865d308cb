"""Sampled softmax for next-item models on large catalogues.

Full softmax scores every position against every item: a [batch, positions, items] logit tensor (and its
gradient), which at a 1M-item catalogue is the whole memory of a GPU. Sampled softmax scores each position
against its true next item and `num_sampled` negatives drawn once per batch (shared by every position, so
the negatives' embeddings are gathered once): [batch, positions, 1 + num_sampled].

Negatives are drawn uniformly or by training popularity. Popularity sampling draws the items the model
must learn to rank below the hits, but over-represents them; the logQ correction (Jean et al., 2015; Yi et
al., 2019) subtracts each candidate's log sampling probability from its logit, so the loss estimates the
full softmax's. A negative that is the position's own target (an "accidental hit") is masked.

The draws use torch's global generator on the model's device — the one dropout uses, which every
checkpoint saves and restores (train/recovery/checkpoint.py, per rank under torchrun) — so a resumed run draws the
same negatives as one trained straight through, and no draw waits for the host.

Evaluation always ranks the full catalogue (recsys/ranking.py); only training is sampled.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from trainwise.recsys.sequences import IGNORE

Sampling = Literal["uniform", "popularity"]


def sampled_softmax_loss(states: torch.Tensor, targets: torch.Tensor, item_table: torch.Tensor,
                         negatives: torch.Tensor, log_q: torch.Tensor | None = None,
                         sparse: bool = False) -> torch.Tensor:
    """Mean cross-entropy of the true item against `negatives` at every non-padded position.

    states [batch, positions, hidden]; targets [batch, positions] item ids (IGNORE where padded);
    item_table [items + 1, hidden] with row 0 the padding row (item i is row i + 1); negatives [S] item
    ids; log_q [items] the log probability of sampling each item (None: uniform, where the correction is
    the same constant for every candidate and cancels). `sparse`: the table's gradient is sparse (only
    the rows looked up), for SparseAdam. With every item as a negative and uniform sampling this is
    exactly the full softmax cross-entropy."""
    valid = targets != IGNORE
    target = targets.clamp_min(0)
    positive = (states * F.embedding(target + 1, item_table, sparse=sparse)).sum(-1)       # [B, L]
    negative = states @ F.embedding(negatives + 1, item_table, sparse=sparse).T            # [B, L, S]
    if log_q is not None:
        positive = positive - log_q[target]
        negative = negative - log_q[negatives]
    negative = negative.masked_fill(negatives == target[..., None], float("-inf"))        # accidental hits
    logits = torch.cat([positive[..., None], negative], dim=-1).float()
    loss = torch.logsumexp(logits, dim=-1) - logits[..., 0]
    return (loss * valid).sum() / valid.sum().clamp_min(1)


class NegativeSampler(nn.Module):
    """Draws `num_sampled` item ids per batch, uniformly or in proportion to training counts (+1, so that
    no item is never drawn), and knows each item's log sampling probability for the logQ correction.
    Its tables are non-persistent buffers: they follow the model to its device but are not weights."""

    def __init__(self, num_items: int, num_sampled: int, sampling: Sampling = "uniform",
                 item_counts: Sequence[int] = ()):
        super().__init__()
        if sampling not in ("uniform", "popularity"):
            raise ValueError(f"model.args.sampling={sampling!r}: use uniform or popularity")
        if num_sampled < 1:
            raise ValueError(f"model.args.num_sampled={num_sampled}: sample at least one negative per batch")
        self.num_items, self.num_sampled, self.sampling = num_items, num_sampled, sampling
        if sampling == "popularity":
            if len(item_counts) not in (0, num_items):
                raise ValueError(f"{len(item_counts)} item counts for {num_items} items")
            counts = torch.as_tensor(list(item_counts) or [0] * num_items, dtype=torch.float64) + 1.0
            probabilities = counts / counts.sum()
            self.register_buffer("cumulative", probabilities.cumsum(0), persistent=False)  # float64
            self.register_buffer("log_q", probabilities.log().float(), persistent=False)
        else:
            self.cumulative = self.log_q = None

    def draw(self, device: torch.device) -> torch.Tensor:
        """[num_sampled] item ids, with replacement, from the global generator of `device`. By inverse CDF
        (torch.multinomial checks its input on the host in some paths: a device sync)."""
        if self.cumulative is None:
            return torch.randint(self.num_items, (self.num_sampled,), device=device)
        uniform = torch.rand(self.num_sampled, dtype=self.cumulative.dtype, device=device)
        return torch.searchsorted(self.cumulative, uniform, right=True).clamp_max(self.num_items - 1)

    def extra_repr(self) -> str:
        return f"num_items={self.num_items}, num_sampled={self.num_sampled}, sampling={self.sampling}"
