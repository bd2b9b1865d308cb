"""Out of memory in a step: halve the micro-batch, accumulate more, retry the same samples — the optimizer
trajectory is that of a run that used the small micro-batch from the start."""
import pytest
import torch
from torch import nn

from tests.conftest import tiny_config
from trainwise.data.bundle import ArrayDataset, DataSpec
from trainwise.errors import TrainingError
from trainwise.rundir.layout import RunDir
from trainwise.train.recovery.checkpoint import read_checkpoint
from trainwise.train.recovery.oom import smaller_micro_batch
from trainwise.train.loop.trainer import Trainer

SPEC = DataSpec(input_shape=(6,), num_classes=3)


class OutOfMemoryAbove(nn.Module):
    """A deterministic MLP that raises the allocator's error for batches larger than `limit`, as a card
    whose memory holds `limit` samples would."""

    def __init__(self, limit, gradient_checkpointing=None):
        super().__init__()
        torch.manual_seed(0)
        self.limit = limit
        self.net = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 3))
        if gradient_checkpointing is not None:
            self.gradient_checkpointing = gradient_checkpointing

    def forward(self, x):
        if self.training and len(x) > self.limit and not getattr(self, "gradient_checkpointing", False):
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate for {len(x)} samples")
        return self.net(x)


def _data():
    g = torch.Generator().manual_seed(0)
    return ArrayDataset(torch.randn(320, 6, generator=g), torch.randint(0, 3, (320,), generator=g))


def _train(tmp_path, name, model, micro_batch_size, **train):
    config = tiny_config(train={"max_steps": 12, "batch_size": 32, "micro_batch_size": micro_batch_size,
                                "log_every": 1, "device": "cpu", "grad_clip_norm": 1.0, **train},
                         data={"num_workers": 0}, eval={"every_steps": None, "every_epoch": False},
                         checkpoint={"every_steps": 6})
    trainer = Trainer(model, _data(), config=config, run_dir=RunDir.create(tmp_path / name), data_spec=SPEC)
    return trainer, trainer.fit()


def test_recovered_run_follows_the_trajectory_of_the_small_micro_batch(tmp_path):
    recovered, summary = _train(tmp_path, "recovered", OutOfMemoryAbove(limit=8), micro_batch_size=32)
    reference, _ = _train(tmp_path, "reference", OutOfMemoryAbove(limit=8), micro_batch_size=8)
    assert summary["status"] == "completed" and recovered.micro_batch_size == 8
    assert recovered.accumulation_steps == 4
    losses = [r["loss"] for r in recovered.run_dir.read_metrics("train")]
    expected = [r["loss"] for r in reference.run_dir.read_metrics("train")]
    assert len(losses) == 12
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-6, atol=1e-7)
    for (name, a), b in zip(recovered.model.state_dict().items(), reference.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
    events = [e for e in recovered.run_dir.read_events() if e["kind"] == "oom_recovered"]
    assert [e["evidence"]["micro_batch_size"] for e in events] == [16, 8]
    assert "effective batch 32 unchanged" in events[0]["message"] and events[0]["step"] == 1
    # the choice is saved with the checkpoint, so a resume starts at micro-batch 8
    assert read_checkpoint(recovered.run_dir.checkpoint_path("last"))["micro_batch_size"] == 8


def test_at_micro_batch_one_gradient_checkpointing_is_tried_then_the_planners_advice(tmp_path):
    trainer, summary = _train(tmp_path, "ckpt", OutOfMemoryAbove(limit=0, gradient_checkpointing=False),
                              micro_batch_size=4)
    assert summary["status"] == "completed" and trainer.model.gradient_checkpointing is True
    with pytest.raises(TrainingError, match="does not fit this device") as error:
        _train(tmp_path, "hopeless", OutOfMemoryAbove(limit=0), micro_batch_size=4)
    assert "trainwise plan" in str(error.value) and "bf16" in str(error.value)


def test_oom_policy_fail_stops_at_once(tmp_path):
    with pytest.raises(torch.OutOfMemoryError):
        _train(tmp_path, "fail", OutOfMemoryAbove(limit=8), micro_batch_size=32, oom_policy="fail")


def test_smaller_micro_batch_divides_the_batch():
    assert smaller_micro_batch(32, 32) == 16
    assert smaller_micro_batch(48, 48) == 24
    assert smaller_micro_batch(24, 48) == 12
    assert smaller_micro_batch(6, 48) == 3
    assert smaller_micro_batch(3, 48) == 1
    assert smaller_micro_batch(1, 48) is None
    assert smaller_micro_batch(10, 30) == 5
