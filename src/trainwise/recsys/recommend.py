"""`trainwise recommend RUN --user ID`: the top-K items for one user from a trained recommender run.

Raw ids in and out: a prepared log's saved id mapping turns the shop's user and item ids into the dense ids
the model knows and back (the synthetic log's ids are already dense). The history used is everything the
run's data holds for the user, newest last; items they already had are excluded unless `include_seen`. An
unknown user gets the most popular items (by training interactions), and the answer says so. For DIN, the
past behaviours that weighed most for the first recommendation are listed with their attention weights.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainwise.errors import ConfigError, DataError


def recommend(run_path: str | Path, user: str, *, k: int = 10, include_seen: bool = False,
              checkpoint: str = "best") -> dict[str, Any]:
    from trainwise.evaluate.run_eval import load_weights
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.run import RunDir

    if k < 1:
        raise ConfigError(f"--k {k}: ask for at least one item.")
    run = RunDir.open(run_path)
    config = run.read_config()
    bundle = build_data(config)
    histories = getattr(bundle.train, "histories", None)
    if histories is None:
        raise DataError(f"{run.path} is not a recommender run (data.name={config.data.name}); `recommend` needs "
                        "one trained with shop-sasrec, shop-din or another data.name=shop recipe.")
    model = build_model(config, bundle.spec)
    state, _, _ = load_weights(run, checkpoint)  # type: ignore[arg-type]
    model.load_state_dict(state)
    model.eval()
    user_ids, item_ids = _id_maps(config.data.path, histories.num_users, histories.num_items)
    k = min(k, histories.num_items)
    dense_user = _dense(user_ids, user)
    counts = histories.train_item_counts()
    if dense_user is None:
        top = np.argsort(-counts, kind="stable")[:k]
        return {"user": user, "known": False, "history": [], "note": "unknown user: the most popular items",
                "recommendations": [{"item": _raw(item_ids, i), "score": int(counts[i])} for i in top]}
    first, last = np.searchsorted(histories.user, [dense_user, dense_user + 1])
    items = histories.item[first:last]
    max_len = bundle.spec.max_len  # type: ignore[attr-defined]
    window = torch.zeros(1, max_len, dtype=torch.long)
    recent = torch.as_tensor(items[-max_len:] + 1)
    window[0, max_len - len(recent):] = recent
    with torch.no_grad():
        scores = model.score_items(window, torch.arange(histories.num_items))[0]
    if not include_seen:
        scores[torch.as_tensor(np.unique(items))] = -torch.inf
    best = scores.topk(k)
    answer: dict[str, Any] = {
        "user": user, "known": True, "history": [_raw(item_ids, i) for i in items[-max_len:]],
        "recommendations": [{"item": _raw(item_ids, int(i)), "score": float(s)}
                            for s, i in zip(best.values.tolist(), best.indices.tolist()) if s > -float("inf")],
        "note": "already-seen items included" if include_seen else "already-seen items excluded"}
    if hasattr(model, "attention_weights") and getattr(model, "attention", False):
        with torch.no_grad():
            weights = model.attention_weights(window, best.indices[:1] + 1)[0, max_len - len(recent):]
        order = torch.argsort(weights, descending=True)[:5].tolist()
        answer["weighed_most"] = {"for_item": answer["recommendations"][0]["item"],
                                  "behaviours": [{"item": _raw(item_ids, int(items[-len(recent):][i])),
                                                  "position_from_newest": len(recent) - i,
                                                  "weight": float(weights[i])} for i in order]}
    return answer


def _id_maps(path: str | None, users: int, items: int) -> tuple[np.ndarray, np.ndarray]:
    """Dense id → raw id for users and items: the prepared log's saved mapping, or the identity."""
    if not path:
        return np.arange(users), np.arange(items)
    from trainwise.data.shards import read_manifest

    manifest = read_manifest(Path(path))
    files = manifest.get("files", {})
    users, items = (np.load(Path(path) / files[name]["file"], allow_pickle=False) for name in ("user_ids", "item_ids"))
    return users, items


def _dense(raw_ids: np.ndarray, user: str) -> int | None:
    matches = np.flatnonzero(raw_ids.astype(str) == str(user))
    if len(matches) == 0 and raw_ids.dtype.kind in "iuf":
        try:
            matches = np.flatnonzero(raw_ids == float(user))
        except ValueError:
            return None
    return int(matches[0]) if len(matches) else None


def _raw(item_ids: np.ndarray, dense: int) -> Any:
    value = item_ids[int(dense)]
    return value.item() if hasattr(value, "item") else value
