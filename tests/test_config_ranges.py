"""Seeds, optimizer hyper-parameters, devices and the telemetry interval are refused in the config, with
the allowed range, instead of failing inside NumPy, torch or a thread (issue K §1, issue L §7)."""
import math

import pytest

from trainwise.config import MAX_SEED, config_from_dict
from trainwise.errors import ConfigError
from trainwise.recipes.datasets import stratified_splits


def _config(*overrides: str):
    return config_from_dict({"train": {"max_steps": 5}}, overrides=list(overrides))


def _refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        _config(*overrides)
    return str(caught.value)


@pytest.mark.parametrize("seed", [0, 1, MAX_SEED])
def test_every_seed_numpy_takes_is_accepted(seed):
    assert _config(f"seed={seed}").seed == seed


@pytest.mark.parametrize("seed", ["-1", str(MAX_SEED + 1), "9223372036854775808", "1.5"])
def test_seeds_outside_numpys_range_are_refused_with_the_range(seed):
    message = _refused(f"seed={seed}")
    assert "seed:" in message and (f"0 to {MAX_SEED}" in message or "valid integer" in message), message


def test_the_largest_seed_still_splits_the_data():
    # the validation split is seeded with seed + 1, which must wrap rather than leave NumPy's range
    import numpy as np

    x, y = np.zeros((40, 2), np.float32), np.arange(40) % 2
    train, val, test = stratified_splits(x, y, seed=MAX_SEED, val_fraction=0.2, test_fraction=0.2)
    assert len(train) + len(val) + len(test) == 40


@pytest.mark.parametrize("override, phrase", [
    ("optim.betas=[-1, 2]", "optim.betas.0: Input should be greater than or equal to 0"),
    ("optim.betas=[0.9, 1.0]", "optim.betas.1: Input should be less than 1"),
    ("optim.betas=[0.9]", "optim.betas"),
    ("optim.lr=0", "optim.lr: Input should be greater than 0"),
    ("optim.lr=.nan", "optim.lr: Input should be a finite number"),
    ("optim.lr=1e400", "optim.lr: Input should be a finite number"),
    ("optim.eps=0", "optim.eps: Input should be greater than 0"),
    ("optim.weight_decay=-0.1", "optim.weight_decay: Input should be greater than or equal to 0"),
    ("optim.momentum=1", "optim.momentum: Input should be less than 1"),
    ("train.epochs=.inf", "train.epochs: Input should be a finite number"),  # math.ceil(inf) overflowed
])
def test_optimizer_hyperparameters_outside_their_valid_range_are_refused(override, phrase):
    assert phrase in _refused(override)


def test_optimizer_hyperparameters_at_their_bounds_are_accepted():
    config = _config("optim.betas=[0, 0.999999]", "optim.weight_decay=0", "optim.momentum=0")
    assert config.optim.betas == (0.0, 0.999999)


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:7", "mps"])
def test_devices_training_can_use_are_accepted(device):
    assert _config(f"train.device={device}").train.device == device


@pytest.mark.parametrize("device", ["meta", "xla", "CPU", "cuda:-1", "cuda:0,1", "gpu", "cuda:99999", "''"])
def test_other_devices_are_refused_with_the_allowed_list(device):
    message = _refused(f"train.device={device}")
    assert "train.device:" in message and "use auto, cpu, cuda, cuda:N (N: the card's index) or mps" in message


@pytest.mark.parametrize("interval, ok", [(0.05, True), (2, True), (3600, True), (0.01, False), (0, False),
                                          (3601, False), (1e300, False), (math.inf, False)])
def test_the_telemetry_interval_is_bounded(interval, ok):
    override = f"telemetry.interval_s={'.inf' if interval == math.inf else interval}"
    if ok:
        assert _config(override).telemetry.interval_s == interval
    else:
        assert "telemetry.interval_s" in _refused(override)
