import math

import pytest

from tests.conftest import tiny_config
from trainwise.config import ScheduleConfig
from trainwise.rundir.layout import RunDir
from trainwise.launch.runs import build_trainer
from trainwise.train.step.schedule import WarmupDecay, lr_factor


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


def test_a_changed_length_refits_the_rest_of_the_decay_without_a_jump():
    """Issue 35's run: 2,000 steps cut to 600 at step 350, then lengthened to 800 at step 500."""
    schedule = ScheduleConfig(warmup_steps=100, decay="cosine", min_lr_ratio=0.1)
    planned = WarmupDecay(schedule, 2000)
    cut = WarmupDecay(schedule, 600)
    assert cut.continue_from(dict(planned.__dict__), 350)
    assert cut(350) == pytest.approx(planned(350))  # where the run was: the same LR
    assert cut(351) == pytest.approx(planned(350), rel=0.01) and cut(351) < cut(350)
    assert cut(600) == pytest.approx(0.1) and all(cut(s) >= cut(s + 1) for s in range(350, 600))
    longer = WarmupDecay(schedule, 800)
    assert longer.continue_from(dict(cut.__dict__), 500)
    assert longer(500) == pytest.approx(cut(500)) and longer(800) == pytest.approx(0.1)
    assert longer.segments == [[0, 2000], [350, 600], [500, 800]]
    same = WarmupDecay(schedule, 2000)
    assert not same.continue_from(dict(planned.__dict__), 350) and same(700) == planned(700)
    for step in (0, 99, 100, 1000, 2000):  # one segment: the plain schedule
        assert planned(step) == pytest.approx(lr_factor(step, warmup=100, max_steps=2000, decay="cosine",
                                                        min_ratio=0.1))


def test_a_resume_during_warmup_keeps_the_warmup_and_decays_to_the_new_end():
    schedule = ScheduleConfig(warmup_steps=100, decay="linear", min_lr_ratio=0.0)
    refit = WarmupDecay(schedule, 300)
    refit.continue_from(dict(WarmupDecay(schedule, 2000).__dict__), 50)
    assert refit(50) == pytest.approx(51 / 100) and refit(99) == pytest.approx(1.0)
    assert refit(200) == pytest.approx(0.5) and refit(300) == pytest.approx(0.0)
