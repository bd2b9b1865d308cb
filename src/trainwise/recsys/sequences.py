"""Behaviour sequences for recommenders: each user's events in time order, cut into training samples and
held-out queries, from a prepared interactions directory (memory-mapped shards) or in-memory arrays.

Item ids in model inputs are shifted by one so that 0 is padding; histories are the `max_len` most recent
events, left-padded (the newest event is always the last column). Targets are plain item ids.

Two training objectives:
- `next_item` (SASRec, GRU4Rec, popularity): a sample is a window of up to `max_len + 1` consecutive
  training events; inputs are its first `max_len`, targets the next item at every position (-100 where
  padded, which cross-entropy ignores). Windows tile each history, so every training transition is used
  once per epoch.
- `ctr` (DIN): a sample is (history, candidate) → clicked or not; every training transition gives one
  positive and `negatives` sampled items. Negatives are drawn on the fly from a hash of (the batch's seed,
  which the trainer's sampler derives from (run seed, epoch, position), and the sample index): the same on
  a resumed run, different every epoch, nothing stored.

A held-out query is one validation or test event; its history is everything the user did before it, and
`seen` (for excluding already-seen items when ranking) is the same rows, read from the sorted arrays
without copying.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torch.utils.data import Dataset

from trainwise.errors import DataError

PAD = 0
IGNORE = -100  # torch's cross-entropy ignore_index: padded positions carry no loss
CLICK_EVAL_SEED = 7_919  # test impressions' negatives: every evaluation of every run scores the same ones


@dataclass(frozen=True)
class Histories:
    """Events sorted by (user, time) with their split code (0 train, 1 val, 2 test) and, when the log has
    them, their behaviour types (codes 0..num_behaviours-1: view, cart, buy, ...)."""

    user: np.ndarray
    item: np.ndarray
    split: np.ndarray
    num_users: int
    num_items: int
    behaviour: np.ndarray | None = None
    num_behaviours: int = 0

    @classmethod
    def from_events(cls, user: np.ndarray, item: np.ndarray, time: np.ndarray, split: np.ndarray,
                    num_users: int, num_items: int, behaviour: np.ndarray | None = None,
                    num_behaviours: int = 0) -> "Histories":
        if len(user) == 0:
            raise DataError("the interaction log has no events.")
        # a user's held-out events come after their training events by construction of the splits; the
        # split code breaks timestamp ties so that no held-out event precedes a training one
        order = np.lexsort((split, time, user))
        sorted_behaviour = None if behaviour is None else np.ascontiguousarray(behaviour[order], dtype=np.int64)
        return cls(np.ascontiguousarray(user[order]), np.ascontiguousarray(item[order]),
                   np.ascontiguousarray(split[order]), num_users, num_items, sorted_behaviour,
                   num_behaviours if behaviour is not None else 0)

    @cached_property
    def user_start(self) -> np.ndarray:
        """Per event, the row of its user's first event."""
        starts = np.r_[0, np.flatnonzero(np.diff(self.user)) + 1]
        lengths = np.diff(np.r_[starts, len(self.user)])
        return np.repeat(starts, lengths)

    def train_item_counts(self) -> np.ndarray:
        return np.bincount(self.item[self.split == 0], minlength=self.num_items)

    def window(self, end: np.ndarray, start: np.ndarray, max_len: int, values: np.ndarray | None = None
               ) -> np.ndarray:
        """Item ids + 1 (or `values` + 1) of rows [end - max_len, end), rows before `start` (another user)
        padded with 0."""
        rows = end[:, None] - max_len + np.arange(max_len)
        valid = rows >= start[:, None]
        return np.where(valid, (self.item if values is None else values)[np.maximum(rows, 0)] + 1, PAD)

    def inputs(self, end: np.ndarray, start: np.ndarray, max_len: int) -> np.ndarray:
        """A model's history input: the item window [batch, max_len]; with behaviour types, the item window
        and the behaviour window (codes + 1, 0 = padding) stacked as [batch, 2, max_len]."""
        items = self.window(end, start, max_len)
        if self.behaviour is None:
            return items
        return np.stack([items, self.window(end, start, max_len, self.behaviour)], axis=1)

    def queries(self, code: int) -> np.ndarray:
        """Rows of the held-out events of one split whose user has at least one earlier event."""
        rows = np.flatnonzero(self.split == code)
        return rows[rows > self.user_start[rows]]


class SequenceSamples(Dataset):
    """Base of the datasets below: batched access (the loader passes whole batches through)."""

    batched = True
    reads_in_place = True  # a batch is a few numpy gathers: cheaper on threads than in worker processes

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        inputs, targets = self.__getitems__([index])
        return inputs[0], targets[0]

    def __getitems__(self, indices: Sequence[int]):
        index = np.asarray(indices, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.size):
            raise IndexError(f"index out of range for {self.size} samples")
        inputs, targets = self.fetch(index, getattr(indices, "seed", None))
        return torch.from_numpy(inputs), torch.from_numpy(targets)


class NextItemWindows(SequenceSamples):
    """`next_item` training samples: windows tiling each user's training events (see module docstring)."""

    def __init__(self, histories: Histories, max_len: int):
        self.histories, self.max_len = histories, max_len
        train = np.flatnonzero(histories.split == 0)
        start = histories.user_start[train]
        # a user's training rows are contiguous (held-out events come after them): windows end at the last
        # training row + 1 and step back by max_len while at least two events (one transition) remain
        last = np.r_[train[1:] != train[:-1] + 1, True] | np.r_[start[1:] != start[:-1], True]
        ends, starts = [], []
        end, first = train[last] + 1, start[last]
        while len(end):
            keep = end - first >= 2
            end, first = end[keep], first[keep]
            ends.append(end), starts.append(first)
            end = end - max_len
        self.end = np.concatenate(ends) if ends else np.empty(0, np.int64)
        self.start = np.concatenate(starts) if starts else np.empty(0, np.int64)
        self.size = len(self.end)
        if self.size == 0:
            raise DataError("no user has two training events: there is nothing to learn a next item from.")

    @property
    def targets(self) -> torch.Tensor:
        """Each window's last target (what the label check reads; every target is an item id)."""
        return torch.from_numpy(self.histories.item[self.end - 1])

    def evaluate_model(self, model: torch.nn.Module, **_):
        raise DataError("the train split of a next-item model is windows of training events, not queries to "
                        "rank; evaluate with --split test (or val): full ranking of each held-out event.")

    def fetch(self, index: np.ndarray, seed: int | None):
        end, start = self.end[index], self.start[index]
        inputs = self.histories.inputs(end - 1, start, self.max_len)
        following = self.histories.window(end, start + 1, self.max_len)  # the item after each input
        items = inputs[:, 0] if inputs.ndim == 3 else inputs
        return inputs, np.where(items > PAD, following - 1, IGNORE).astype(np.int64)


class HeldOutQueries(SequenceSamples):
    """Validation or test events as queries: (history before the event, the event's item)."""

    def __init__(self, histories: Histories, code: int, max_len: int, max_queries: int | None, seed: int):
        self.histories, self.max_len = histories, max_len
        rows = histories.queries(code)
        self.held_out_events = len(rows)
        if max_queries is not None and len(rows) > max_queries:  # a fixed, seeded subset of the queries
            rows = np.sort(np.random.default_rng([seed, code]).choice(rows, max_queries, replace=False))
        self.rows = rows
        self.start = histories.user_start[rows]
        self.size = len(rows)

    @property
    def targets(self) -> torch.Tensor:
        return torch.from_numpy(self.histories.item[self.rows])

    def fetch(self, index: np.ndarray, seed: int | None):
        rows = self.rows[index]
        return self.histories.inputs(rows, self.start[index], self.max_len), self.histories.item[rows]

    def seen(self, index: int) -> np.ndarray:
        """Items the user interacted with before query `index` (a view into the sorted arrays)."""
        return self.histories.item[self.start[index]:self.rows[index]]

    def evaluate_model(self, model: torch.nn.Module, *, device: torch.device, exclude_seen: bool = True,
                       sampled_negatives: int | None = None):
        """Full-ranking metrics of `model` on these queries and prediction rows (recsys/ranking.py): what
        `trainwise eval` reports for a recommender instead of per-sample outputs."""
        from trainwise.recsys.ranking import full_ranking

        if not callable(getattr(model, "score_items", None)):
            raise DataError(f"{type(model).__name__} has no score_items(history, items) -> [users, items] scores, "
                            "which full-ranking evaluation calls; add one (see trainwise.recsys.models).")
        was_training = model.training
        model.eval().to(device)
        try:
            metrics, rows = full_ranking(
                model.score_items, fetch=self.fetch_for_ranking, seen=self.seen, num_queries=self.size,
                num_items=self.histories.num_items, item_counts=self.histories.train_item_counts(), device=device,
                exclude_seen=exclude_seen, sampled_negatives=sampled_negatives)
        finally:
            model.train(was_training)
        if self.size < self.held_out_events:
            metrics["protocol"] += (f"; {self.size} of {self.held_out_events} held-out events, a seeded sample "
                                    "(data.args.max_eval_queries)")
        users = self.histories.user[self.rows]
        header = ["query", "user", "target_item", "target_rank", "top10"]
        return metrics, (header, [[q, int(users[q]), *rest] for q, *rest in rows])

    def fetch_for_ranking(self, index: np.ndarray):
        return HeldOutQueries.fetch(self, index, None)


class HeldOutClicks(HeldOutQueries):
    """Held-out queries for a click model: as samples, (history | the item + 1) → clicked (1); evaluation
    still ranks the whole catalogue for each query (`evaluate_model`) and also scores each query's click
    impressions (the item and `negatives` sampled ones, fixed): click AUC and GAUC (per-user AUC)."""

    def __init__(self, histories: Histories, code: int, max_len: int, max_queries: int | None, seed: int,
                 negatives: int = 4):
        super().__init__(histories, code, max_len, max_queries, seed)
        self.negatives = negatives

    def evaluate_model(self, model: torch.nn.Module, *, device: torch.device, **options):
        metrics, rows = super().evaluate_model(model, device=device, **options)
        impressions = ClickPairs(self.histories, self.rows, self.max_len, self.negatives, CLICK_EVAL_SEED)
        metrics.update(impressions.click_metrics(model, device))
        return metrics, rows

    @property
    def targets(self) -> torch.Tensor:
        return torch.ones(self.size, dtype=torch.int64)

    def fetch(self, index: np.ndarray, seed: int | None):
        history, item = super().fetch(index, seed)
        return with_candidate(history, item), np.ones(len(index), np.int64)


class ClickPairs(SequenceSamples):
    """`ctr` samples: inputs are [history (max_len) | candidate + 1], targets 1 (the next item) or 0 (a
    sampled item). Used for training (rows = training transitions) and validation (rows = queries)."""

    def __init__(self, histories: Histories, rows: np.ndarray, max_len: int, negatives: int, seed: int):
        self.histories, self.max_len, self.negatives, self.seed = histories, max_len, negatives, seed
        self.rows, self.start = rows, histories.user_start[rows]
        self.size = len(rows) * (1 + negatives)

    @classmethod
    def for_training(cls, histories: Histories, max_len: int, negatives: int, seed: int) -> "ClickPairs":
        rows = np.flatnonzero(histories.split == 0)
        rows = rows[rows > histories.user_start[rows]]
        if len(rows) == 0:
            raise DataError("no user has two training events: there is nothing to learn a click from.")
        return cls(histories, rows, max_len, negatives, seed)

    @property
    def targets(self) -> torch.Tensor:
        return torch.from_numpy((np.arange(self.size) % (1 + self.negatives) == 0).astype(np.int64))

    @torch.no_grad()
    def click_metrics(self, model: torch.nn.Module, device: torch.device, batch: int = 4096) -> dict:
        """Click AUC over all impressions and GAUC (per-user AUC weighted by impressions), fixed negatives."""
        from trainwise.recsys.metrics import group_auc

        was_training = model.training
        model.eval()
        try:
            scores = np.concatenate([
                model(torch.from_numpy(self.fetch(np.arange(start, min(start + batch, self.size)), None)[0])
                      .to(device))[:, 1].float().cpu().numpy() for start in range(0, self.size, batch)])
        finally:
            model.train(was_training)
        labels = self.targets.numpy()
        users = self.histories.user[self.rows[np.arange(self.size) // (1 + self.negatives)]]
        overall = group_auc(np.zeros(self.size), labels, scores)["gauc"]
        return {"click_auc": overall, **group_auc(users, labels, scores),
                "click_protocol": f"each held-out event's item vs {self.negatives} sampled items (fixed); gauc: "
                                  "per-user AUC weighted by impressions"}

    def fetch(self, index: np.ndarray, seed: int | None):
        query, slot = np.divmod(index, 1 + self.negatives)
        rows = self.rows[query]
        positive = self.histories.item[rows]
        # a batch's seed changes with the epoch and position; without one (validation), fixed negatives
        key = np.uint64(seed if seed is not None else self.seed) & np.uint64(2**63 - 1)
        negative = (mix64(index.astype(np.uint64) ^ mix64(key)) % np.uint64(self.histories.num_items)).astype(np.int64)
        negative = np.where(negative == positive, (negative + 1) % self.histories.num_items, negative)
        candidate = np.where(slot == 0, positive, negative)
        history = self.histories.inputs(rows, self.start[query], self.max_len)
        return with_candidate(history, candidate), (slot == 0).astype(np.int64)


def with_candidate(history: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """A click sample: the history with the candidate item + 1 as its last column (with behaviour types,
    the candidate's behaviour is 0: what the user will do with it is what the model predicts)."""
    if history.ndim == 2:
        return np.concatenate([history, (candidate + 1)[:, None]], axis=1)
    column = np.stack([candidate + 1, np.zeros_like(candidate)], axis=1)[:, :, None]
    return np.concatenate([history, column], axis=2)


def mix64(x: np.ndarray | np.uint64) -> np.ndarray:
    """splitmix64's finaliser: a counter-based hash, so a negative is a pure function of (key, index)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))
