"""Ranking metrics for recommenders: HR@K, NDCG@K and MRR with one relevant item per query.

The model scores every candidate item ([N, items]); the target is the index of the item the user actually
chose (leave-one-out evaluation). Its rank is 1 + the number of items scored strictly higher, so ties are
counted in the model's favour; use continuous scores.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainwise.runtime.arrays import as_numpy

DEFAULT_CUTOFFS = (1, 5, 10)


def target_ranks(targets: Any, scores: Any) -> np.ndarray:
    """1-based rank of each query's relevant item among all items."""
    scores = as_numpy(scores).astype(np.float64)
    targets = as_numpy(targets).astype(np.int64)
    relevant = scores[np.arange(len(targets)), targets]
    return 1 + (scores > relevant[:, None]).sum(axis=1)


def ranking_metrics(targets: Any, scores: Any, *, cutoffs: Sequence[int] = DEFAULT_CUTOFFS) -> dict[str, Any]:
    """HR@K (share of queries whose item is in the top K), NDCG@K (1/log2(rank+1) inside the top K) and MRR."""
    ranks = target_ranks(targets, scores)
    items = as_numpy(scores).shape[1]
    metrics: dict[str, Any] = {"task": "ranking", "samples": int(len(ranks)), "items": int(items),
                               "mrr": float((1.0 / ranks).mean()), "median_rank": float(np.median(ranks))}
    for k in cutoffs:
        if k > items:
            continue
        hit = ranks <= k
        metrics[f"hr@{k}"] = float(hit.mean())
        metrics[f"ndcg@{k}"] = float(np.where(hit, 1.0 / np.log2(ranks + 1), 0.0).mean())
    # a model that ranks at random puts the item in the top K with probability K / items
    metrics["random_baseline"] = {f"hr@{k}": k / items for k in cutoffs if k <= items}
    return metrics


def group_auc(groups: Any, labels: Any, scores: Any) -> dict[str, Any]:
    """GAUC, the click-model metric: each user's (group's) ROC AUC over their own impressions, averaged with
    the user's impression count as weight. Users whose impressions are all clicks or all non-clicks have
    no AUC and are left out (`gauc_users` counts the users that count). Ties score half (as roc_auc_score)."""
    from scipy.stats import rankdata

    groups, labels, scores = (as_numpy(a).reshape(-1) for a in (groups, labels, scores))
    labels = labels.astype(bool)
    order = np.argsort(groups, kind="stable")
    groups, labels, scores = groups[order], labels[order], scores[order].astype(np.float64)
    bounds = np.r_[0, np.flatnonzero(groups[1:] != groups[:-1]) + 1, len(groups)]
    total, weight, counted = 0.0, 0, 0
    for start, end in zip(bounds[:-1], bounds[1:]):
        positive = labels[start:end]
        clicks = int(positive.sum())
        if clicks == 0 or clicks == end - start:
            continue
        ranks = rankdata(scores[start:end])  # average ranks: ties count half
        auc = (ranks[positive].sum() - clicks * (clicks + 1) / 2) / (clicks * (end - start - clicks))
        total += auc * (end - start)
        weight += end - start
        counted += 1
    return {"gauc": total / weight if weight else None, "gauc_users": counted}
