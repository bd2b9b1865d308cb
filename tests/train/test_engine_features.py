"""Timing split, gradient checkpointing, torch.compile and the plain Python API."""
import time

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from tests.conftest import tiny_config
from trainwise import Trainer
from trainwise.data.bundle import DataSpec
from trainwise.recipes.models import cnn
from trainwise.rundir.layout import RunDir


class SlowDataset(Dataset):
    def __init__(self, n=64):
        self.x, self.y = torch.randn(n, 6), torch.randint(0, 2, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.01)  # a slow decode
        return self.x[i], self.y[i]


def test_data_wait_is_measured_apart_from_compute(tmp_path):
    config = tiny_config(train={"max_steps": 8, "batch_size": 16, "log_every": 4},
                         eval={"every_steps": None, "every_epoch": False})
    trainer = Trainer(nn.Linear(6, 2), SlowDataset(), config=config, run_dir=RunDir.create(tmp_path / "r"))
    trainer.fit()
    records = trainer.run_dir.read_metrics("train")
    assert len(records) == 2
    for r in records:
        assert r["data_wait_fraction"] > 0.5  # 16 × 10 ms of sleep dwarfs a 6→2 linear layer
        assert r["data_wait_s"] + r["compute_s"] == pytest.approx(r["step_time_s"])
        assert r["samples_per_s"] > 0


def test_gradient_checkpointing_recomputes_and_gives_the_same_gradients():
    spec = DataSpec(input_shape=(1, 8, 8), num_classes=10)
    torch.manual_seed(0)
    plain = cnn(spec, channels=(4, 8), hidden=16, dropout=0.0)
    checkpointed = cnn(spec, channels=(4, 8), hidden=16, dropout=0.0, gradient_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    calls = {"n": 0}
    checkpointed.blocks[0][0].register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    x, y = torch.randn(5, 1, 8, 8), torch.randint(0, 10, (5,))
    for model in (plain, checkpointed):
        nn.functional.cross_entropy(model(x), y).backward()
    assert calls["n"] == 2  # forward, then again during backward
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_python_api_with_a_plain_tensor_dataset(tmp_path):
    x = torch.randn(256, 4)
    y = (x[:, 0] > 0).long()
    config = tiny_config(optim={"lr": 0.05}, train={"max_steps": 60, "batch_size": 32, "log_every": 20},
                         eval={"every_steps": 20, "monitor": "val/accuracy"})
    trainer = Trainer(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)),
                      TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:]),
                      config=config, run_dir=RunDir.create(tmp_path / "api"))
    summary = trainer.fit()
    assert summary["status"] == "completed"
    assert summary["final"]["accuracy"] > 0.9
    assert (tmp_path / "api" / "model.safetensors").exists()


@pytest.mark.slow
def test_torch_compile_trains(tmp_path):
    config = tiny_config(model={"name": "mlp", "args": {"hidden": [16], "dropout": 0.0}, "compile": True},
                         train={"max_steps": 6, "log_every": 3})
    from trainwise.launch.runs import build_trainer

    run = RunDir(tmp_path / "c")
    trainer = build_trainer(config, run)
    run.initialise()
    assert trainer.forward is not trainer.model
    assert trainer.fit()["status"] == "completed"


def _short_run(tmp_path, callbacks=(), **train):
    from trainwise.launch.runs import build_trainer

    run = RunDir(tmp_path / "run")
    trainer = build_trainer(tiny_config(train={"max_steps": 10, "log_every": 5, **train}), run, callbacks)
    run.initialise()
    trainer.fit()
    return trainer


def test_progress_is_plain_lines_off_a_terminal_and_a_bar_on_one(tmp_path):
    import io

    from rich.console import Console

    from trainwise.train.loop.progress import ProgressDisplay

    plain_out = io.StringIO()
    _short_run(tmp_path / "plain", [ProgressDisplay(Console(file=plain_out, force_terminal=False, width=200))])
    lines = [line for line in plain_out.getvalue().splitlines() if line.startswith("step ")]
    assert any(line.startswith("step 5/10  loss") and "samples/s" in line and "eta" in line for line in lines)
    assert any("val: loss" in line for line in lines)

    bar_out = io.StringIO()
    display = ProgressDisplay(Console(file=bar_out, force_terminal=True, width=200))
    seen = {}
    original = display.on_step_end

    def spy(trainer):
        original(trainer)
        seen["task"] = display.progress.tasks[0] if display.progress else None

    display.on_step_end = spy
    _short_run(tmp_path / "bar", [display])
    assert seen["task"].completed == 10 and seen["task"].total == 10
    assert "loss" in seen["task"].description


def test_tensorboard_events_mirror_the_metrics(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = _short_run(tmp_path)
    events = EventAccumulator(str(trainer.run_dir.tensorboard_dir()))
    events.Reload()
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == [5, 10]
    logged = [r["loss"] for r in trainer.run_dir.read_metrics("train")]
    assert [e.value for e in losses] == pytest.approx(logged)
    assert "val/accuracy" in events.Tags()["scalars"]
