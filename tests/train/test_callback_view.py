"""Callbacks are given a narrow view of the run (train/callbacks/base.py TrainerView), never the Trainer: they read
where the run is and what it logged, may ask it to stop or to evaluate, and cannot reach the engine's parts."""
import dataclasses

import pytest
import torch
from torch import nn

from tests.conftest import tiny_config
from trainwise.data.bundle import ArrayDataset, DataSpec
from trainwise.rundir.layout import RunDir
from trainwise.train.callbacks.base import Callback, TrainerView
from trainwise.train.loop.trainer import Trainer


class Watch(Callback):
    def __init__(self):
        self.views, self.steps, self.logged, self.evaluated = set(), [], [], []

    def on_fit_start(self, trainer):
        self.views.add(id(trainer))
        self.first = trainer

    def on_step_end(self, trainer):
        self.views.add(id(trainer))
        self.steps.append(trainer.step)
        if trainer.step == 6:
            trainer.request_stop("test")

    def on_log(self, trainer, record):
        self.logged.append((record, dict(trainer.metrics["train"])))

    def on_eval(self, trainer, record):
        self.evaluated.append((record["step"], trainer.metrics["val"]["step"], trainer.epoch))


def test_a_callback_gets_the_view_and_cannot_reach_the_optimizer(tmp_path):
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))
    config = tiny_config(train={"max_steps": 10, "batch_size": 16, "log_every": 3, "device": "cpu"},
                         data={"num_workers": 0}, eval={"every_steps": 2, "every_epoch": False})
    watch = Watch()
    trainer = Trainer(nn.Linear(6, 3), data, data, config=config, run_dir=RunDir.create(tmp_path / "run"),
                      callbacks=[watch], data_spec=DataSpec(input_shape=(6,), num_classes=3))
    summary = trainer.fit()

    view = watch.first
    assert isinstance(view, TrainerView) and not isinstance(view, Trainer) and len(watch.views) == 1
    for engine_part in ("optimizer", "train_step", "scheduler", "scaler", "checkpointer", "loader", "callbacks"):
        assert not hasattr(view, engine_part), engine_part
    assert not any(value is trainer for value in (getattr(view, f.name) for f in dataclasses.fields(view)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.max_steps = 1  # a callback reads the run; it does not rewire it
    assert view.model is trainer.model and view.run_dir is trainer.run_dir and view.state is trainer.state
    # request_stop through the view stops the run after that step
    assert watch.steps == [1, 2, 3, 4, 5, 6] and summary["status"] == "stopped" and view.step == 6
    # metrics: the record just logged is the newest of its split
    assert [r["step"] for r, _ in watch.logged] == [3, 6] and all(r == newest for r, newest in watch.logged)
    assert watch.evaluated == [(2, 2, 0), (4, 4, 1), (6, 6, 1)]
