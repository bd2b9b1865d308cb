"""`trainwise recommend RUN --user ID` (or `--users FILE`, one id a line): the top-K items for users of a
trained recommender run.

Raw ids in and out: a prepared log's saved id mapping turns the shop's user and item ids into the dense ids
the model knows and back (the synthetic log's ids are already dense). The history used is everything the
run's data holds for the user, newest last; items they already had are excluded unless `include_seen`. An
unknown user gets the most popular items (by training interactions), and the answer says so. For DIN, the
past behaviours that weighed most for the first recommendation are listed with their attention weights.
The run's model and data are loaded once for a whole batch of users.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainwise.errors import ConfigError, DataError


class Recommender:
    """A trained recommender run, loaded once: its model, its users' histories and the id mapping."""

    def __init__(self, run_path: str | Path, checkpoint: str = "best"):
        from trainwise.rundir.weights import load_weights
        from trainwise.recipes.factories import build_data, build_model
        from trainwise.rundir.layout import RunDir

        run = RunDir.open(run_path)
        config = run.read_config()
        bundle = build_data(config)
        self.histories = getattr(bundle.train, "histories", None)
        if self.histories is None:
            raise DataError(f"{run.path} is not a recommender run (data.name={config.data.name}); `recommend` "
                            "needs one trained with shop-sasrec, shop-din or another data.name=shop recipe.")
        self.model = build_model(config, bundle.spec)
        state, _, _ = load_weights(run, checkpoint)  # type: ignore[arg-type]
        self.model.load_state_dict(state)
        self.model.eval()
        self.max_len = bundle.spec.max_len  # type: ignore[attr-defined]
        self.user_ids, self.item_ids = _id_maps(config.data.path, self.histories.num_users,
                                                self.histories.num_items)
        self.counts = self.histories.train_item_counts()

    def history_window(self, dense_user: int) -> tuple[np.ndarray, torch.Tensor]:
        """(the user's items, oldest first; the model's input window of the most recent `max_len`)."""
        histories = self.histories
        first, last = np.searchsorted(histories.user, [dense_user, dense_user + 1])
        window = histories.inputs(np.array([last]), np.array([first]), self.max_len)
        return histories.item[first:last], torch.from_numpy(window)

    def recommend(self, user: str, *, k: int = 10, include_seen: bool = False) -> dict[str, Any]:
        if k < 1:
            raise ConfigError(f"--k {k}: ask for at least one item.")
        k = min(k, self.histories.num_items)
        item_ids, model = self.item_ids, self.model
        dense_user = _dense(self.user_ids, user)
        if dense_user is None:
            top = np.argsort(-self.counts, kind="stable")[:k]
            return {"user": user, "known": False, "history": [], "note": "unknown user: the most popular items",
                    "recommendations": [{"item": _raw(item_ids, i), "score": int(self.counts[i])} for i in top]}
        items, window = self.history_window(dense_user)
        recent = items[-self.max_len:]
        with torch.no_grad():
            scores = model.score_items(window, torch.arange(self.histories.num_items))[0]
        if not include_seen:
            scores[torch.as_tensor(np.unique(items))] = -torch.inf
        best = scores.topk(k)
        answer: dict[str, Any] = {
            "user": user, "known": True, "history": [_raw(item_ids, i) for i in recent],
            "recommendations": [{"item": _raw(item_ids, int(i)), "score": float(s)}
                                for s, i in zip(best.values.tolist(), best.indices.tolist()) if s > -float("inf")],
            "note": "already-seen items included" if include_seen else "already-seen items excluded"}
        if hasattr(model, "attention_weights") and getattr(model, "attention", False):
            with torch.no_grad():
                weights = model.attention_weights(window, best.indices[:1] + 1)[0, self.max_len - len(recent):]
            order = torch.argsort(weights, descending=True)[:5].tolist()
            answer["weighed_most"] = {"for_item": answer["recommendations"][0]["item"],
                                      "behaviours": [{"item": _raw(item_ids, int(recent[i])),
                                                      "position_from_newest": len(recent) - i,
                                                      "weight": float(weights[i])} for i in order]}
        return answer

    def recommend_many(self, users: Iterable[str], *, k: int = 10,
                       include_seen: bool = False) -> Iterator[dict[str, Any]]:
        for user in users:
            yield self.recommend(user, k=k, include_seen=include_seen)


def recommend(run_path: str | Path, user: str, *, k: int = 10, include_seen: bool = False,
              checkpoint: str = "best") -> dict[str, Any]:
    if k < 1:
        raise ConfigError(f"--k {k}: ask for at least one item.")
    return Recommender(run_path, checkpoint).recommend(user, k=k, include_seen=include_seen)


def read_user_file(path: str | Path) -> list[str]:
    """One raw user id a line; blank lines and `#` comments skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--users {path}: no such file; give a text file with one user id a line.")
    users = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    users = [u for u in users if u and not u.startswith("#")]
    if not users:
        raise DataError(f"--users {path}: the file holds no user ids; write one id a line.")
    return users


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
