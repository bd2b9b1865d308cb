from __future__ import annotations

import numpy as np
import pytest

import trainwise.data
from trainwise.data.interactions import split_by_time
from trainwise.data.prepare import PrepareOptions, prepare


def click_log(n_users: int = 30, seed: int = 0) -> list[list]:
    """Each user's clicks spread over time, rows shuffled: a random split would put a user's future in train."""
    rng = np.random.default_rng(seed)
    rows = []
    for user in range(n_users):
        for t in np.sort(rng.integers(1_000, 100_000, size=int(rng.integers(4, 15)))):
            rows.append([f"user-{user}", f"sku{rng.integers(0, 40)}", int(t), int(rng.integers(1, 6))])
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def read_split(out, split):
    dataset = trainwise.data.open(out, split)
    inputs = dataset.column("inputs")
    return inputs[:, 0], inputs[:, 1], dataset.column("timestamp")


def test_a_random_split_of_this_log_would_leak(tmp_path):
    rows = click_log()
    users = np.array([r[0] for r in rows])
    times = np.array([r[2] for r in rows])
    train = np.random.default_rng(0).random(len(rows)) < 0.8
    leaks = [u for u in set(users) if (times[train & (users == u)].max(initial=0) >
                                       times[~train & (users == u)].min(initial=10**9))]
    assert leaks, "the fixture must be one where a random split puts some user's future into training"


def test_global_time_split_puts_every_training_event_before_val_and_test(tmp_path, write_csv):
    source = write_csv(tmp_path / "clicks.csv", ["user_id", "item_id", "timestamp", "rating"], click_log())
    out = tmp_path / "out"
    manifest = prepare(source, out, PrepareOptions(val_fraction=0.1, test_fraction=0.1), workers=1).manifest
    assert manifest["kind"] == "interactions" and manifest["split_method"]["how"] == "time"
    _, _, train_t = read_split(out, "train")
    _, _, val_t = read_split(out, "val")
    _, _, test_t = read_split(out, "test")
    assert len(val_t) and len(test_t)
    assert train_t.max() < val_t.min() and val_t.max() < test_t.min()


def test_last_k_split_holds_out_each_users_latest_events(tmp_path, write_csv):
    source = write_csv(tmp_path / "clicks.csv", ["user_id", "item_id", "timestamp", "rating"], click_log())
    out = tmp_path / "out"
    prepare(source, out, PrepareOptions(split="last-k", last_k=2), workers=1)
    train_u, _, train_t = read_split(out, "train")
    test_u, _, test_t = read_split(out, "test")
    val_u, _, val_t = read_split(out, "val")
    for user in np.unique(test_u):
        assert (test_u == user).sum() == 2 and (val_u == user).sum() == 2
        assert train_t[train_u == user].max() <= val_t[val_u == user].min() <= test_t[test_u == user].min()


def test_ids_are_dense_and_each_users_history_is_in_time_order(tmp_path, write_csv):
    rows = click_log()
    source = write_csv(tmp_path / "clicks.csv", ["user_id", "item_id", "timestamp", "rating"], rows)
    out = tmp_path / "out"
    manifest = prepare(source, out, PrepareOptions(), workers=1).manifest
    users, items, times = read_split(out, "train")
    assert manifest["num_users"] == len({r[0] for r in rows}) and manifest["num_items"] == len({r[1] for r in rows})
    assert users.min() >= 0 and users.max() < manifest["num_users"]
    assert items.min() >= 0 and items.max() < manifest["num_items"]
    for user in np.unique(users):
        assert np.all(np.diff(times[users == user]) >= 0)
    user_ids = np.load(out / manifest["files"]["user_ids"]["file"])
    first = trainwise.data.open(out, "train")
    original = user_ids[first.column("inputs")[0, 0]]
    rating = first.column("targets")[0]
    assert any(r[0] == original and r[2] == times[0] and r[3] == rating for r in rows)


def test_movielens_ratings_dat(tmp_path):
    lines = [f"{u}::{m}::{r}::{t}" for u, m, r, t in [(1, 10, 5, 100), (1, 11, 3, 200), (2, 10, 4, 150),
                                                       (2, 12, 2, 300), (1, 12, 4, 400), (2, 11, 1, 500)]]
    (tmp_path / "ratings.dat").write_text("\n".join(lines) + "\n")
    manifest = prepare(tmp_path / "ratings.dat", tmp_path / "out",
                       PrepareOptions(split="last-k", last_k=1, val_fraction=0.1, test_fraction=0.1)).manifest
    assert manifest["kind"] == "interactions" and manifest["columns"]["target"] == "rating"
    assert manifest["num_users"] == 2 and manifest["num_items"] == 3
    assert manifest["splits"]["test"]["count"] == 2 and manifest["splits"]["train"]["count"] == 2


@pytest.mark.parametrize("how", ["time", "last-k"])
def test_split_by_time_is_leak_free_on_ties(how):
    users = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    times = np.array([5, 5, 5, 9, 1, 2, 3, 3])
    split = split_by_time(users, times, how=how, val_fraction=0.25, test_fraction=0.25, last_k=1)
    sorted_users, sorted_times = users[split.order], times[split.order]
    for user in (0, 1):
        mine = sorted_users == user
        for early, late in ((0, 1), (1, 2), (0, 2)):
            a, b = sorted_times[mine & (split.split == early)], sorted_times[mine & (split.split == late)]
            if len(a) and len(b):
                assert a.max() <= b.min()
