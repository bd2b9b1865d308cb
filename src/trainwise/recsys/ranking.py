"""Honest offline evaluation of a recommender: every held-out event ranked against the whole catalogue.

Full ranking is the default: the model scores all items for each query (a chunk of users at a time, so a
100k-item catalogue needs about 64 MB), the user's already-seen items are removed (except the target
itself, so a repeat purchase still counts), and the target's rank gives HR@K, NDCG@K, MRR and a
per-query AUC over the catalogue. Ties are split evenly (rank = 1 + higher + half the equal), so a model
that scores many items alike gets no credit for it.

Sampled metrics (the target among N random items) flatter models several-fold and can reverse rankings;
they are computed only when asked for, and every key carries the `sampled_` prefix.

Also measured: coverage@K (share of the catalogue that appears in any top-K) and popularity_bias@K (mean
popularity percentile, by training interactions, of the recommended items: 0.5 is what random picks get,
1.0 means only the most popular items).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

CUTOFFS = (1, 5, 10, 20)
SCORES_PER_CHUNK = 2**24  # users x items scored at once: 64 MB of float32
ROWS_KEPT = 1000  # queries written to the predictions CSV


def rank_metrics(ranks: np.ndarray, candidates: np.ndarray, cutoffs: Sequence[int],
                 prefix: str = "") -> dict[str, float]:
    """HR@K, NDCG@K (one relevant item: 1 / log2(rank + 1) inside the top K), MRR and the mean per-query AUC
    (share of the other candidates scored below the target)."""
    ranks = ranks.astype(np.float64)
    metrics = {f"{prefix}mrr": float((1.0 / ranks).mean()),
               f"{prefix}auc": float((1 - (ranks - 1) / np.maximum(candidates - 1, 1)).mean())}
    for k in cutoffs:
        hit = ranks <= k
        metrics[f"{prefix}hr@{k}"] = float(hit.mean())
        metrics[f"{prefix}ndcg@{k}"] = float(np.where(hit, 1.0 / np.log2(ranks + 1), 0.0).mean())
    return metrics


def tie_split_rank(scores: torch.Tensor, target_score: torch.Tensor) -> torch.Tensor:
    """1 + (items scored higher) + half of (other items scored the same), per row."""
    higher = (scores > target_score[:, None]).sum(1)
    equal = (scores == target_score[:, None]).sum(1) - 1
    return 1 + higher + torch.div(equal, 2, rounding_mode="floor")


def popularity_percentile(item_counts: np.ndarray) -> np.ndarray:
    """Per item, the share of the catalogue with fewer training interactions (ties averaged)."""
    order = np.argsort(item_counts, kind="stable")
    ranks = np.empty(len(item_counts))
    ranks[order] = np.arange(len(item_counts))
    sorted_counts = item_counts[order]
    first = np.searchsorted(sorted_counts, item_counts, "left")
    last = np.searchsorted(sorted_counts, item_counts, "right") - 1
    return (first + last) / 2 / max(len(item_counts) - 1, 1)


@torch.no_grad()
def full_ranking(score_items: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                 fetch: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], seen: Callable[[int], np.ndarray],
                 num_queries: int, num_items: int, item_counts: np.ndarray, device: torch.device,
                 cutoffs: Sequence[int] = CUTOFFS, exclude_seen: bool = True, sampled_negatives: int | None = None,
                 seed: int = 0) -> tuple[dict[str, Any], list[list[Any]]]:
    """Metrics over `num_queries` queries and the first ROWS_KEPT prediction rows.

    `fetch(indices)` gives (histories, target items); `seen(i)` the items query i's user already had;
    `score_items(histories, items)` the model's [users, items] scores."""
    cutoffs = [k for k in cutoffs if k <= num_items]
    top = max(cutoffs)
    chunk = max(1, SCORES_PER_CHUNK // num_items)
    all_items = torch.arange(num_items, device=device)
    ranks, candidates, sampled_ranks, recommended, rows = [], [], [], [], []
    rng = np.random.default_rng(seed)
    for first in range(0, num_queries, chunk):
        index = np.arange(first, min(first + chunk, num_queries))
        history, target = fetch(index)
        history = torch.as_tensor(history, device=device)
        target = torch.as_tensor(target, device=device)
        # contiguous: a model may hand back one row expanded to every user (popularity); masking one user's
        # seen items must not write into the others'
        scores = score_items(history, all_items).float().contiguous()
        row_of = torch.arange(len(index), device=device)
        target_score = scores[row_of, target].clone()
        allowed = torch.full((len(index),), num_items, device=device)
        if exclude_seen:
            allowed = allowed - _mask_seen(scores, target, target_score, [np.unique(seen(int(i))) for i in index])
        rank = tie_split_rank(scores, target_score)
        ranks.append(rank.cpu().numpy())
        candidates.append(allowed.cpu().numpy())
        best = scores.topk(top, dim=1).indices
        recommended.append(best.cpu().numpy())
        if sampled_negatives:
            sampled_ranks.append(_sampled_rank(scores, target, target_score, sampled_negatives, rng))
        for i, query in enumerate(index[:max(0, ROWS_KEPT - len(rows))]):
            rows.append([int(query), int(target[i]), int(rank[i]), " ".join(map(str, best[i, :10].tolist()))])
    ranks_all, candidates_all = np.concatenate(ranks), np.concatenate(candidates)
    recommended_all = np.concatenate(recommended)
    percentile = popularity_percentile(np.asarray(item_counts, dtype=np.float64))
    metrics: dict[str, Any] = {
        "task": "ranking", "protocol": "full ranking over the catalogue" + (
            ", already-seen items excluded" if exclude_seen else ", already-seen items included"),
        "samples": int(num_queries), "items": int(num_items), "median_rank": float(np.median(ranks_all)),
        **rank_metrics(ranks_all, candidates_all, cutoffs)}
    for k in cutoffs:
        metrics[f"coverage@{k}"] = float(len(np.unique(recommended_all[:, :k])) / num_items)
        metrics[f"popularity_bias@{k}"] = float(percentile[recommended_all[:, :k]].mean())
    metrics["random_baseline"] = {f"hr@{k}": k / num_items for k in cutoffs}
    if sampled_negatives:
        sampled = np.concatenate(sampled_ranks)
        metrics.update(rank_metrics(sampled, np.full(len(sampled), sampled_negatives + 1), cutoffs, "sampled_"))
        metrics["sampled_protocol"] = (f"SAMPLED: the target among {sampled_negatives} random unseen items; "
                                       "flatters every model, not comparable with full-ranking figures")
    return metrics, rows


def _mask_seen(scores: torch.Tensor, target: torch.Tensor, target_score: torch.Tensor,
               seen_items: list[np.ndarray]) -> torch.Tensor:
    """Score each user's already-seen items -inf, in place (the target keeps its score); per row, how many
    items that took out of the candidates."""
    device, row_of = scores.device, torch.arange(len(seen_items), device=scores.device)
    lengths = torch.as_tensor([len(s) for s in seen_items], device=device)
    if int(lengths.sum()):
        columns = torch.as_tensor(np.concatenate(seen_items), device=device)
        scores[torch.repeat_interleave(row_of, lengths), columns] = -torch.inf
    target_seen = torch.as_tensor([int(t) in set(s.tolist()) for t, s in zip(target.tolist(), seen_items)],
                                  device=device)
    scores[row_of, target] = target_score
    return lengths - target_seen.long()


def _sampled_rank(scores: torch.Tensor, target: torch.Tensor, target_score: torch.Tensor, negatives: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Rank among `negatives` uniformly drawn items that are neither seen (score -inf) nor the target."""
    ranks = []
    for row in range(len(scores)):
        pool = torch.isfinite(scores[row]).nonzero().squeeze(1).cpu().numpy()
        pool = pool[pool != int(target[row])]
        drawn = rng.choice(pool, min(negatives, len(pool)), replace=False)
        sample = torch.cat([scores[row, torch.as_tensor(drawn, device=scores.device)], target_score[row:row + 1]])
        ranks.append(int(tie_split_rank(sample[None], target_score[row:row + 1])[0]))
    return np.asarray(ranks)
