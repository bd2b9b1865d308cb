"""A loss that goes NaN/Inf: fp32 skips the update on the device, then stops at the log step naming the
step and the module; fp16's scaler skips and counts."""
import pytest
import torch
from torch import nn

from tests.conftest import tiny_config
from trainwise.data.bundle import ArrayDataset, DataSpec
from trainwise.errors import TrainingError
from trainwise.rundir.layout import RunDir
from trainwise.train.loop.trainer import Trainer


class Blows(nn.Module):
    """Multiplies by inf from a given forward call on."""

    def __init__(self, from_call):
        super().__init__()
        self.calls, self.from_call = 0, from_call

    def forward(self, x):
        self.calls += 1
        return x * float("inf") if self.calls >= self.from_call else x


def _data(n=128):
    g = torch.Generator().manual_seed(0)
    return ArrayDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def _trainer(tmp_path, model, precision="fp32", **train):
    config = tiny_config(train={"max_steps": 12, "batch_size": 16, "precision": precision, "log_every": 1,
                                "device": "cpu", **train}, eval={"every_steps": None, "every_epoch": False})
    return Trainer(model, _data(), config=config, run_dir=RunDir.create(tmp_path / "run"),
                   data_spec=DataSpec(input_shape=(6,), num_classes=3))


def test_fp32_nonfinite_names_step_and_module(tmp_path):
    model = nn.Sequential(nn.Linear(6, 8), Blows(from_call=5), nn.Linear(8, 3))
    trainer = _trainer(tmp_path, model)
    with pytest.raises(TrainingError) as error:
        trainer.fit()
    assert "step 5" in str(error.value)
    assert "1 (Blows)" in str(error.value)  # module "1" of the Sequential
    assert trainer.step == 5 and "skipped on the device" in str(error.value)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the bad update was never applied
    assert trainer.run_dir.read_summary()["status"] == "failed"
    event = [e for e in trainer.run_dir.read_events() if e["kind"] == "nonfinite"][0]
    assert event["evidence"]["module"] == "1" and event["step"] == 5


def test_fp16_overflow_is_skipped_and_counted(tmp_path):
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    poisoned_steps = {3, 4}
    state = {"backward": 0}

    def poison(grad):
        state["backward"] += 1
        return grad * float("inf") if state["backward"] in poisoned_steps else grad

    model[0].weight.register_hook(poison)
    trainer = _trainer(tmp_path, model, precision="fp16")
    summary = trainer.fit()
    assert summary["status"] == "completed"
    assert summary["skipped_steps"] == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())
    logged = trainer.run_dir.read_metrics("train")
    assert logged[-1]["skipped_steps"] == 2
