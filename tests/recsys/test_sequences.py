"""Behaviour sequences: no split leaks the future, windows and padding are what the models assume, and
sampled negatives are a pure function of (seed, epoch, position, index) so that resume is exact."""
import numpy as np
import pytest
import torch

from trainwise.recsys.data import shop
from trainwise.recsys.sequences import IGNORE, PAD, ClickPairs, Histories, NextItemWindows
from trainwise.train.parallel.sampler import SeededBatch, batch_seed

TINY = dict(users=200, items=150, events=8_000, categories=6)


def _bundle(**kwargs):
    return shop(seed=0, val_fraction=0.1, test_fraction=0.1, **{**TINY, **kwargs})


@pytest.mark.parametrize("split", ["last-k", "time"])
def test_no_split_leaks_the_future(split):
    from trainwise.data.interactions import split_by_time
    from trainwise.recsys.generator import generate_shop_log

    log = generate_shop_log(**TINY, seed=1)
    codes = split_by_time(log.user, log.timestamp, how=split, val_fraction=0.1, test_fraction=0.1, last_k=1)
    split_code = np.empty(len(log), np.int8)
    split_code[codes.order] = codes.split
    for user in np.unique(log.user):
        mine = log.user == user
        times, code = log.timestamp[mine], split_code[mine]
        if (code > 0).any() and (code == 0).any():
            assert times[code == 0].max() <= times[code > 0].min()  # every held-out event after training
        if (code == 2).any() and (code == 1).any():
            assert times[code == 1].max() <= times[code == 2].min()
    if split == "time":  # one global cut-off for every user
        assert log.timestamp[split_code == 0].max() <= log.timestamp[split_code == 1].min()
        assert log.timestamp[split_code == 1].max() <= log.timestamp[split_code == 2].min()
    else:
        assert np.all(np.bincount(log.user[split_code == 2]) <= 1)  # one test event per user


def test_a_query_sees_only_its_users_past():
    bundle = _bundle()
    test = bundle.test
    histories: Histories = test.histories
    inputs, targets = test.__getitems__(list(range(len(test))))
    for i in range(len(test)):
        seen = test.seen(i)
        assert np.all(histories.user[test.start[i]:test.rows[i]] == histories.user[test.rows[i]])
        recent = inputs[i][inputs[i] > PAD].numpy() - 1
        assert np.array_equal(recent, seen[-len(recent):])  # the most recent events, newest last
        assert targets[i] == histories.item[test.rows[i]]


def test_training_windows_predict_the_next_item_and_ignore_padding():
    histories = Histories.from_events(
        user=np.array([0, 0, 0, 0, 1, 1]), item=np.array([5, 6, 7, 8, 1, 2]), time=np.arange(6),
        split=np.array([0, 0, 0, 2, 0, 0], np.int8), num_users=2, num_items=10)
    windows = NextItemWindows(histories, max_len=4)
    inputs, targets = windows.__getitems__([0, 1])
    assert inputs.tolist() == [[0, 0, 6, 7], [0, 0, 0, 2]]  # ids + 1, left-padded; user 0's test event held out
    assert targets.tolist() == [[IGNORE, IGNORE, 6, 7], [IGNORE, IGNORE, IGNORE, 2]]
    long = NextItemWindows(histories, max_len=1)  # windows tile the history: each transition once
    assert sorted(long.__getitems__(list(range(len(long))))[1].view(-1).tolist()) == [2, 6, 7]


def test_negatives_are_a_function_of_the_batch_seed_and_change_every_epoch():
    pairs: ClickPairs = _bundle(objective="ctr", negatives=3).train
    indices = list(range(0, 400, 7))

    def fetch(epoch):
        batch = SeededBatch(indices)
        batch.seed = batch_seed(0, epoch, 5)
        return pairs.__getitems__(batch)

    first, again, later = fetch(0), fetch(0), fetch(1)
    assert torch.equal(first[0], again[0])  # a resumed run draws exactly the same negatives
    assert not torch.equal(first[0], later[0])
    labels = first[1]
    assert labels.tolist() == [int(i % 4 == 0) for i in indices]
    candidates, positives = first[0][:, -1] - 1, pairs.histories.item[pairs.rows[np.array(indices) // 4]]
    assert torch.all((candidates == torch.from_numpy(positives)) == (labels == 1))
    # validation (no batch seed) is fixed
    assert torch.equal(pairs.__getitems__(indices)[0], pairs.__getitems__(indices)[0])


def test_a_user_with_one_event_is_kept_for_popularity_only():
    from trainwise.data.interactions import split_by_time
    from trainwise.recsys.data import sequence_bundle

    user = np.array([0, 1, 1, 1, 1])
    item, time = np.array([3, 0, 1, 2, 4]), np.array([5, 1, 2, 3, 4])
    codes = split_by_time(user, time, how="last-k", val_fraction=0.1, test_fraction=0.1, last_k=1)
    split = np.empty(len(user), np.int8)
    split[codes.order] = codes.split
    histories = Histories.from_events(user, item, time, split, num_users=2, num_items=5)
    bundle = sequence_bundle(histories, objective="next_item", max_len=3, negatives=1, max_eval_queries=None, seed=0)
    assert len(bundle.train) == 1 and len(bundle.test) == 1  # only user 1 has a transition and a test event
    assert histories.train_item_counts()[3] == 1  # user 0's single event still counts as popularity
