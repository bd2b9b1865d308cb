from __future__ import annotations

import numpy as np

from trainwise.data.prepare import PrepareOptions
from trainwise.data.splits import split_codes


def test_a_rare_class_lands_in_every_split_and_the_seed_fixes_the_split():
    labels = np.array([0] * 180 + [1] * 20)
    options = PrepareOptions(val_fraction=0.15, test_fraction=0.15, seed=3)
    codes = split_codes(labels, len(labels), options)
    counts = [int((codes == c).sum()) for c in (0, 1, 2)]
    assert abs(counts[0] - 140) <= 1 and abs(counts[1] - 30) <= 1 and counts[2] == 30
    for code in (0, 1, 2):
        share_rare = (labels[codes == code] == 1).mean()
        assert abs(share_rare - 0.1) < 0.02, "class shares are kept in each split"
    np.testing.assert_array_equal(codes, split_codes(labels, len(labels), options))
    assert not np.array_equal(codes, split_codes(labels, len(labels), PrepareOptions(seed=4,
                                                 val_fraction=0.15, test_fraction=0.15)))


def test_a_class_of_one_sample_falls_back_to_a_random_split():
    labels = np.array([0] * 30 + [1] * 30 + [2])
    codes = split_codes(labels, len(labels), PrepareOptions(val_fraction=0.2, test_fraction=0.2))
    train, val, test = np.bincount(codes).tolist()
    assert train + val + test == 61 and 11 <= val <= 13 and 11 <= test <= 13
