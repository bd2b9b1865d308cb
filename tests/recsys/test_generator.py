"""The synthetic shop log: deterministic, shaped like a shop, and built so the relevant history is the part
in the candidate's category (checked from the generator's ground truth, not assumed)."""
import numpy as np
import pytest

from trainwise.errors import DataError
from trainwise.recsys.generator import generate_shop_log

SMALL = dict(users=400, items=500, events=30_000, categories=12)


@pytest.fixture(scope="module")
def log():
    return generate_shop_log(**SMALL, seed=3)


def test_same_seed_same_log_other_seed_other_log(log):
    again = generate_shop_log(**SMALL, seed=3)
    for name in ("user", "item", "behaviour", "timestamp", "session", "anchor", "item_category"):
        assert np.array_equal(getattr(log, name), getattr(again, name)), name
    other = generate_shop_log(**SMALL, seed=4)
    assert not np.array_equal(log.item[:1000], other.item[:1000])


def test_shape_of_a_shop(log):
    assert abs(len(log) - SMALL["events"]) < 0.05 * SMALL["events"]
    assert np.all(np.diff(log.user) >= 0)  # sorted by user, then time
    same_user = log.user[1:] == log.user[:-1]
    assert np.all(np.diff(log.timestamp)[same_user] > 0)
    counts = np.sort(np.bincount(log.item, minlength=log.num_items))[::-1]
    assert counts[: log.num_items // 10].sum() > 0.4 * counts.sum()  # power law: top 10% of items, >40% of events
    assert set(np.unique(log.behaviour)) == {0, 1, 2}
    # sessions are separated by inactivity: a new session starts exactly where the gap exceeds 30 minutes
    gap = np.diff(log.timestamp)
    new_session = np.diff(log.session) > 0
    assert np.array_equal(new_session[same_user], gap[same_user] > 1_800)


def test_ground_truth_the_next_item_follows_the_last_one_in_its_category(log):
    followed = np.flatnonzero(log.anchor >= 0)
    anchors = log.anchor[followed]
    assert len(followed) > 0.5 * len(log)
    assert np.all(anchors < followed) and np.all(log.user[anchors] == log.user[followed])
    assert np.all(log.item_category[log.item[anchors]] == log.item_category[log.item[followed]])
    assert np.all(np.abs(log.item_rank[log.item[followed]] - log.item_rank[log.item[anchors]]) <= 3)
    # the anchor is the *last* same-category event before, often not the previous event at all: a model
    # that looks only at the most recent behaviour misses it, one that attends by category finds it
    assert np.mean(anchors != followed - 1) > 0.3
    previous = followed[followed > 0] - 1
    previous = previous[log.user[previous] == log.user[previous + 1]]
    near_previous = (np.abs(log.item_rank[log.item[previous + 1]] - log.item_rank[log.item[previous]]) <= 3) & \
        (log.item_category[log.item[previous + 1]] == log.item_category[log.item[previous]])
    assert near_previous.mean() < 0.8  # while every followed event is near its anchor (above)


def test_impossible_sizes_are_refused():
    with pytest.raises(DataError, match="categories"):
        generate_shop_log(users=5, items=3, events=50, categories=10)
