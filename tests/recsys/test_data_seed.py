"""The synthetic shop log is seeded apart from the run: several training seeds (`ablate --seeds`) train on the
same log and are judged on the same queries, unless `data_seed: null` asks for a new log per seed."""
import numpy as np
import torch

from trainwise.recsys.data import shop

SMALL = dict(val_fraction=0.1, test_fraction=0.1, users=300, items=120, events=6000, categories=6,
             max_eval_queries=50, objective="ctr")


def _held_out(bundle):
    index = np.arange(len(bundle.test) // 2)
    inputs, targets = bundle.test.__getitems__(index.tolist())
    return bundle.test.rows.copy(), torch.as_tensor(inputs), torch.as_tensor(targets)


def test_run_seeds_share_the_log_and_the_evaluation_queries():
    first, second = shop(seed=0, **SMALL), shop(seed=7, **SMALL)
    rows_a, inputs_a, targets_a = _held_out(first)
    rows_b, inputs_b, targets_b = _held_out(second)
    assert np.array_equal(rows_a, rows_b)
    assert torch.equal(inputs_a, inputs_b) and torch.equal(targets_a, targets_b)
    assert np.array_equal(first.train.rows, second.train.rows)
    assert first.notes["generated"]["seed"] == second.notes["generated"]["seed"] == 0


def test_data_seed_null_follows_the_run_seed():
    first, second = shop(seed=0, data_seed=None, **SMALL), shop(seed=7, data_seed=None, **SMALL)
    assert second.notes["generated"]["seed"] == 7
    assert not np.array_equal(first.train.rows, second.train.rows) or \
        not np.array_equal(_held_out(first)[1].numpy(), _held_out(second)[1].numpy())
