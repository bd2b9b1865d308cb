"""Full-ranking metrics against a brute-force reference written the slow, obvious way."""
import math

import numpy as np
import pytest
import torch

from trainwise.recsys.ranking import full_ranking, popularity_percentile

ITEMS, QUERIES = 60, 37


def _reference(scores, targets, seen, k):
    """Per query: drop seen items except the target, sort, find the target's rank with ties split evenly."""
    hr = ndcg = mrr = auc = 0.0
    for row, target in enumerate(targets):
        kept = [i for i in range(ITEMS) if i == target or i not in seen[row]]
        higher = sum(scores[row, i] > scores[row, target] for i in kept)
        equal = sum(scores[row, i] == scores[row, target] for i in kept if i != target)
        rank = 1 + higher + equal // 2
        hr += rank <= k
        ndcg += 1 / math.log2(rank + 1) if rank <= k else 0
        mrr += 1 / rank
        auc += 1 - (rank - 1) / (len(kept) - 1)
    return {"hr": hr / len(targets), "ndcg": ndcg / len(targets), "mrr": mrr / len(targets),
            "auc": auc / len(targets)}


@pytest.mark.parametrize("ties", [False, True])
def test_full_ranking_matches_brute_force(ties, monkeypatch):
    rng = np.random.default_rng(7)
    scores = rng.normal(size=(QUERIES, ITEMS)).astype(np.float32)
    if ties:  # coarse scores: many items tie with the target
        scores = np.round(scores * 2) / 2
    targets = rng.integers(0, ITEMS, QUERIES)
    seen = [set(rng.choice(ITEMS, rng.integers(0, 15), replace=False).tolist()) for _ in range(QUERIES)]
    seen[0].add(int(targets[0]))  # a repeat: the target itself was seen before and must stay rankable
    monkeypatch.setattr("trainwise.recsys.ranking.SCORES_PER_CHUNK", 8 * ITEMS)  # several user chunks

    metrics, rows = full_ranking(
        lambda history, items: torch.from_numpy(scores)[history[:, 0]][:, items],
        fetch=lambda index: (index[:, None], targets[index]), seen=lambda i: np.array(sorted(seen[i]), dtype=np.int64),
        num_queries=QUERIES, num_items=ITEMS, item_counts=np.arange(ITEMS), device=torch.device("cpu"),
        cutoffs=(1, 5, 10))
    for k in (1, 5, 10):
        expected = _reference(scores, targets, seen, k)
        assert metrics[f"hr@{k}"] == pytest.approx(expected["hr"])
        assert metrics[f"ndcg@{k}"] == pytest.approx(expected["ndcg"])
    assert metrics["mrr"] == pytest.approx(expected["mrr"])
    assert metrics["auc"] == pytest.approx(expected["auc"])
    assert metrics["samples"] == QUERIES and len(rows) == QUERIES
    assert not any(key.startswith("sampled") for key in metrics)  # sampled metrics only on request


def test_seen_items_never_appear_in_the_top_k_and_sampled_metrics_are_labelled():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(QUERIES, ITEMS)).astype(np.float32)
    targets = rng.integers(0, ITEMS, QUERIES)
    seen = [np.setdiff1d(np.argsort(-scores[q])[:5], [targets[q]]) for q in range(QUERIES)]  # the model's favourites
    metrics, rows = full_ranking(
        lambda history, items: torch.from_numpy(scores)[history[:, 0]][:, items],
        fetch=lambda index: (index[:, None], targets[index]), seen=lambda i: seen[i], num_queries=QUERIES,
        num_items=ITEMS, item_counts=np.arange(ITEMS), device=torch.device("cpu"), sampled_negatives=20)
    for query, _, _, top in rows:
        assert not set(map(int, top.split())) & set(seen[query].tolist())
    assert "SAMPLED" in metrics["sampled_protocol"]
    assert metrics["sampled_ndcg@10"] > metrics["ndcg@10"]  # what sampling does to every model


def test_popularity_percentile():
    assert popularity_percentile(np.array([0, 10, 5, 5])).tolist() == [0.0, 1.0, 0.5, 0.5]


def test_one_users_seen_items_do_not_mask_anothers_when_scores_are_shared():
    shared = torch.linspace(1, 0, ITEMS)  # the same scores for everyone, handed back as an expanded view
    targets = np.array([0, 0])
    seen = [np.array([1, 2, 3]), np.array([], dtype=np.int64)]
    metrics, rows = full_ranking(
        lambda history, items: shared[items].expand(len(history), -1),
        fetch=lambda index: (index[:, None], targets[index]), seen=lambda i: seen[i], num_queries=2,
        num_items=ITEMS, item_counts=np.arange(ITEMS), device=torch.device("cpu"), cutoffs=(5,))
    assert rows[0][3].split()[:4] == ["0", "4", "5", "6"] and rows[1][3].split()[:4] == ["0", "1", "2", "3"]


def test_gauc_matches_a_per_user_sklearn_reference():
    from sklearn.metrics import roc_auc_score

    from trainwise.recsys.metrics import group_auc

    rng = np.random.default_rng(3)
    users = rng.integers(0, 40, 600)
    labels = (rng.random(600) < 0.3).astype(int)
    scores = np.round(rng.normal(size=600) + labels * 0.8, 1)  # rounded: ties happen
    expected, weights = [], []
    for user in np.unique(users):
        mine = users == user
        if len(set(labels[mine])) == 2:  # a user with only clicks or only non-clicks has no AUC
            expected.append(roc_auc_score(labels[mine], scores[mine]))
            weights.append(mine.sum())
    result = group_auc(users, labels, scores)
    assert result["gauc_users"] == len(expected)
    assert result["gauc"] == pytest.approx(np.average(expected, weights=weights), abs=1e-12)
    assert group_auc(np.zeros(3), np.ones(3), np.arange(3)) == {"gauc": None, "gauc_users": 0}
