import math

import pytest

from tests.conftest import tiny_config
from trainwise.config import ScheduleConfig
from trainwise.rundir.layout import RunDir
from trainwise.launch.runs import build_trainer
from trainwise.train.schedule import WarmupDecay, lr_factor


def test_linear_warmup_then_each_decay():
    kw = dict(warmup=10, max_steps=110)
    assert lr_factor(0, decay="cosine", min_ratio=0, **kw) == pytest.approx(0.1)
    assert lr_factor(9, decay="cosine", min_ratio=0, **kw) == pytest.approx(1.0)
    assert lr_factor(60, decay="cosine", min_ratio=0, **kw) == pytest.approx(0.5)
    assert lr_factor(110, decay="cosine", min_ratio=0.1, **kw) == pytest.approx(0.1)
    assert lr_factor(60, decay="linear", min_ratio=0, **kw) == pytest.approx(0.5)
    assert lr_factor(100, decay="constant", min_ratio=0, **kw) == 1.0


def test_warmup_fraction_replaces_steps():
    schedule = WarmupDecay(ScheduleConfig(warmup_steps=3, warmup_fraction=0.25), max_steps=200)
    assert schedule.warmup == 50


def test_logged_lr_follows_the_schedule_per_optimizer_step(tmp_path):
    config = tiny_config(optim={"lr": 0.01}, schedule={"warmup_steps": 10, "decay": "cosine"},
                         train={"max_steps": 40, "batch_size": 32, "micro_batch_size": 8, "log_every": 5})
    run = RunDir(tmp_path / "run")
    trainer = build_trainer(config, run)
    run.initialise()
    trainer.fit()
    for record in run.read_metrics("train"):
        # the LR after step s is the one the next step will use
        expected = 0.01 * lr_factor(record["step"], warmup=10, max_steps=40, decay="cosine", min_ratio=0)
        assert record["lr"] == pytest.approx(expected), record["step"]
        assert math.isfinite(record["grad_norm"]) and record["grad_norm"] > 0
